"""Commands as values (quoting, env, sudo, secrets) and the interruptible parallel map."""

import subprocess
import threading

import pytest

from sparkcluster.engine.command import Command, shell_path
from sparkcluster.engine.parallel import parallel_map


def test_argv_values_are_quoted_so_inventory_text_cannot_inject_shell():
    c = Command.argv(["echo", "$(touch /tmp/x); `id`"])
    assert c.line() == "echo '$(touch /tmp/x); `id`'"
    assert subprocess.run(["sh", "-c", c.line()], capture_output=True, text=True).stdout == "$(touch /tmp/x); `id`\n"


def test_only_the_given_env_is_exported_and_quoted():
    c = Command("echo \"$A|$B\"", env={"B": "two words", "A": "x'y"})
    assert c.line() == "export A='x'\"'\"'y' B='two words'; echo \"$A|$B\""
    assert subprocess.run(["sh", "-c", c.line()], capture_output=True, text=True).stdout == "x'y|two words\n"


def test_sudo_without_a_password_never_prompts():
    assert Command("id -u", sudo=True).line() == "sudo -n -H -- sh -c 'id -u'"


def test_sudo_password_is_read_by_the_remote_shell_and_never_in_argv():
    line = Command("id -u", sudo=True).line(sudo_password=True)
    assert line.startswith("IFS= read -r p\n")
    assert "sudo -S -p ''" in line and "sudo -n true" in line
    # the password itself is never part of the line: it arrives on stdin
    assert "hunter2" not in Command("x", sudo=True, stdin="hunter2").line(sudo_password=True)


def test_display_masks_secrets():
    c = Command("curl -H 'Authorization: Bearer tok123' x", secrets=("tok123",))
    assert c.display() == "curl -H 'Authorization: Bearer ********' x"


def test_a_root_script_is_shown_as_it_really_runs(tmp_path):
    # Failed before the fix: `sudo set -e; umask 077; ...`, which pasted into a shell runs only `set -e` as root.
    script = f"set -e; umask 077; echo x > {tmp_path}/f; id -u"
    shown = Command(script, sudo=True).display()
    assert shown == f"sudo sh -c 'set -e; umask 077; echo x > {tmp_path}/f; id -u'"
    # The shown line is the script, whole, as one `sh -c` argument: run without the `sudo `, it does all of it.
    ran = subprocess.run(["sh", "-c", shown.removeprefix("sudo ")], capture_output=True, text=True)
    assert ran.returncode == 0 and (tmp_path / "f").read_text() == "x\n"
    # One plain command stays as short as it is.
    assert Command("usermod -aG docker spark", sudo=True).display() == "sudo usermod -aG docker spark"
    assert Command.argv(["chown", "-R", "a b", "/x"], sudo=True).display() == "sudo chown -R 'a b' /x"


@pytest.mark.parametrize("path,expected", [
    ("~", '"$HOME"'), ("~/a b/c", "\"$HOME\"/'a b/c'"), ("/etc/x", "/etc/x"), ("a;b", "'a;b'"),
])
def test_remote_paths_stay_relative_to_the_remote_home(path, expected):
    assert shell_path(path) == expected


def test_parallel_map_keeps_order_and_runs_concurrently():
    barrier = threading.Barrier(4, timeout=5)  # only passes if all four calls run at once

    def work(x: int) -> int:
        barrier.wait()
        return x * x

    assert parallel_map(work, [1, 2, 3, 4], workers=4) == [1, 4, 9, 16]


def test_parallel_map_aborts_on_failure_and_calls_on_abort_first():
    aborted = []
    release = threading.Event()

    def work(x: int) -> int:
        if x == 0:
            raise ValueError("boom")
        release.wait(timeout=5)  # stands for a remote command; on_abort is what ends it
        return x

    with pytest.raises(ValueError, match="boom"):
        parallel_map(work, [0, 1, 2], workers=3, on_abort=lambda: (aborted.append(True), release.set()))
    assert aborted == [True]
