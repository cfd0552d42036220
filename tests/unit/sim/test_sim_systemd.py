"""The simulated Spark's systemd: the unit-file parser (as data), and systemctl with its runner run for real under
a scratch root (SIM_SYSTEMD_ROOT), as root, with real processes: starts, restarts per Restart=, stops with
KillMode= and TimeoutStopSec=, journals, and the boot's start of enabled units."""

from __future__ import annotations

import fcntl
import importlib.machinery
import importlib.util
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from types import ModuleType

import pytest

from sparkcluster.node import gpuclock
from sparkcluster.sim import machine
from sparkcluster.sim.hostfiles import SYSTEMD

HOST = Path(str(resources.files("sparkcluster.sim") / "host"))


def _unit_module() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("sim_systemd_unit", str(HOST / "sim-systemd-unit"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


unit_file = _unit_module()

FULL = """\
# the supervisor, as a tool would write it
[Unit]
Description=sparkcluster supervisor
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
User=nobody
Group=nogroup
WorkingDirectory=-/var/lib/sc
Environment="A=one two" B=3
Environment=C='x y'
EnvironmentFile=-/etc/default/sc
EnvironmentFile=/etc/sc.env
ExecStart=/usr/bin/python3 -m sc.supervise \\
    --unit %n --name "a b"
Restart=always
RestartSec=1min 30s
KillMode=control-group
TimeoutStopSec=5s
MemoryMax=2G

[Install]
WantedBy=multi-user.target
"""


# ---- the parser --------------------------------------------------------------------------------------------------
def test_a_full_unit_parses_to_what_the_runner_reads():
    unit = unit_file.parse_unit(FULL, "sc.service", "/etc/systemd/system/sc.service")
    assert unit["description"] == "sparkcluster supervisor"
    assert unit["type"] == "exec" and unit["user"] == "nobody" and unit["group"] == "nogroup"
    assert (unit["working_directory"], unit["working_directory_optional"]) == ("/var/lib/sc", True)
    assert unit["environment"] == [("A", "one two"), ("B", "3"), ("C", "x y")]
    assert unit["environment_files"] == [["/etc/default/sc", True], ["/etc/sc.env", False]]
    assert unit["exec_start"] == [{"argv": ["/usr/bin/python3", "-m", "sc.supervise", "--unit", "sc.service",
                                            "--name", "a b"], "ignore_failure": False}]
    assert (unit["restart"], unit["restart_sec"], unit["kill_mode"], unit["timeout_stop_sec"]) == \
        ("always", 90.0, "control-group", 5.0)
    assert unit["wanted_by"] == ["multi-user.target"]
    # systemd warns of what it does not know and goes on; After=/Wants= are known (and ignored)
    assert unit["warnings"] == ["/etc/systemd/system/sc.service:22: Unknown key name 'MemoryMax' in section "
                                "'Service', ignoring."]


def test_defaults_are_systemds():
    unit = unit_file.parse_unit("[Service]\nExecStart=sleep 5\n", "s.service")
    assert (unit["type"], unit["restart"], unit["restart_sec"], unit["kill_mode"], unit["timeout_stop_sec"]) == \
        ("simple", "no", 0.1, "control-group", 90.0)
    assert (unit["start_limit_interval_sec"], unit["start_limit_burst"]) == (10.0, 5)
    assert unit["exec_start"] == [{"argv": ["sleep", "5"], "ignore_failure": False}]
    assert unit["user"] == "" and unit["wanted_by"] == [] and unit["remain_after_exit"] is False


@pytest.mark.parametrize("text, says", [
    ("[Unit]\nDescription=x\n[Service]\nRestart=always\n", "Service has no ExecStart=, ExecStop=, or SuccessAction="),
    ("[Service]\nExecStart=/bin/true\nExecStart=\n", "Service has no ExecStart="),
    ("[Service]\nExecStart=/bin/true\nExecStart=/bin/false\n", "more than one ExecStart= setting"),
    ("[Service]\nType=forking\nExecStart=/bin/true\n", "Type=forking is not emulated"),
    ("[Service]\nType=oneshot\nExecStart=/bin/true\nRestart=always\n", "isn't allowed for Type=oneshot"),
    ("[Service]\nExecStart=bin/true\n", "Neither a valid executable name nor an absolute path"),
    ("[Service]\nExecStart=+/bin/true\n", "prefix '+' is not emulated"),
    ("[Service]\nExecStart=/bin/echo %Z\n", "Failed to parse ExecStart="),
    ("[Service]\nExecStartPre=/bin/true\nExecStart=/bin/true\n", "bad.service:2: ExecStartPre= is not emulated"),
])
def test_a_unit_systemd_would_refuse_is_refused(text, says):
    with pytest.raises(unit_file.UnitError, match=re.escape(says)):
        unit_file.parse_unit(text, "bad.service", "/etc/systemd/system/bad.service")


def test_bad_values_are_warnings_and_keep_the_default():
    unit = unit_file.parse_unit("[Service]\nExecStart=-/bin/false\nRestart=sometimes\nRestartSec=soon\n"
                                "[Frobnicate]\nX=1\n", "w.service", "w")
    assert (unit["restart"], unit["restart_sec"], unit["exec_start"][0]["ignore_failure"]) == ("no", 0.1, True)
    assert unit["warnings"] == ["w:3: Failed to parse Restart=sometimes, ignoring.",
                                "w:4: Failed to parse RestartSec=soon, ignoring.",
                                "w:5: Unknown section 'Frobnicate'. Ignoring."]


def test_the_gpu_clock_caps_oneshot_unit_is_one_the_emulation_runs():
    """bootstrap's unit (node/gpuclock.py) re-applies the cap at every boot: a simulated boot runs it too."""
    unit = unit_file.parse_unit(gpuclock.unit_text(2000), gpuclock.UNIT_NAME, gpuclock.UNIT_PATH)
    assert (unit["type"], unit["remain_after_exit"], unit["wanted_by"], unit["warnings"]) == \
        ("oneshot", True, ["multi-user.target"], [])
    assert unit["exec_start"] == [{"argv": ["/bin/sh", "-c", gpuclock.apply_line(2000)], "ignore_failure": False}]


@pytest.mark.parametrize("text, seconds", [("5", 5.0), ("5s", 5.0), ("1min", 60.0), ("1min 30s", 90.0),
                                           ("500ms", 0.5), ("2h", 7200.0), ("infinity", None)])
def test_timespans(text, seconds):
    assert unit_file.parse_timespan(text) == seconds


@pytest.mark.parametrize("text", ["5x", "", "min", "5 parsecs"])
def test_a_bad_timespan_is_an_error(text):
    with pytest.raises(ValueError):
        unit_file.parse_timespan(text)


def test_specifiers_resolve_the_users_home():
    unit = unit_file.parse_unit("[Service]\nUser=root\nExecStart=/bin/ls %h %u %p 100%%\n", "x.service")
    assert unit["exec_start"][0]["argv"] == ["/bin/ls", "/root", "root", "x", "100%"]


# ---- systemctl and the runner, for real --------------------------------------------------------------------------
@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("the emulated systemd runs services as User=, so as root")
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    yield tmp_path
    for pid_file in (tmp_path / "run/sim-systemd").glob("*.pid"):  # whatever a failed test left running
        subprocess.run(["sh", "-c", f'kill $(cat "{pid_file}") 2>/dev/null'], check=False)
    for state in (tmp_path / "run/sim-systemd").glob("*.state"):
        main = _state_pid(state)
        if main:
            _kill(main)


def _state_pid(state: Path) -> int:
    match = re.search(r'"MainPID": (\d+)', state.read_text())
    return int(match.group(1)) if match else 0


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def systemctl(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/usr/bin/python3", str(HOST / "systemctl"), *args], capture_output=True, text=True,
                          env={"SIM_SYSTEMD_ROOT": str(root), "PATH": "/usr/bin:/bin"}, timeout=60)


def journalctl(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(HOST / "journalctl"), *args], capture_output=True, text=True,
                          env={"SIM_SYSTEMD_ROOT": str(root), "PATH": "/usr/bin:/bin"}, timeout=60)


def write_unit(root: Path, name: str, service: str, install: bool = True) -> None:
    text = f"[Unit]\nDescription=test {name}\n\n[Service]\n{service}\n"
    if install:
        text += "\n[Install]\nWantedBy=multi-user.target\n"
    (root / "etc/systemd/system" / f"{name}.service").write_text(text)


def show(root: Path, name: str) -> dict[str, str]:
    out = systemctl(root, "show", "-p", "ActiveState,SubState,MainPID,NRestarts,Result", name)
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


def wait_for(predicate, seconds: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_enable_now_restart_always_and_disable_now(root):
    write_unit(root, "keeper", "ExecStart=/bin/sleep 1000\nRestart=always\nRestartSec=1")
    out = systemctl(root, "enable", "--now", "keeper")
    assert out.returncode == 0, out.stderr
    link = root / "etc/systemd/system/multi-user.target.wants/keeper.service"
    assert os.readlink(link) == str(root / "etc/systemd/system/keeper.service")
    assert f"Created symlink {link} \u2192 " in out.stderr
    assert systemctl(root, "is-active", "keeper").stdout == "active\n"
    assert systemctl(root, "is-enabled", "keeper.service").stdout == "enabled\n"
    first = show(root, "keeper")
    assert first["ActiveState"] == "active" and first["NRestarts"] == "0" and alive(int(first["MainPID"]))
    assert (root / "run/sim-systemd/keeper.pid").is_file()

    os.kill(int(first["MainPID"]), signal.SIGKILL)
    again = wait_for(lambda: (s := show(root, "keeper"))["NRestarts"] == "1" and s["ActiveState"] == "active" and s,
                     1 + 2)
    assert again, show(root, "keeper")
    assert again["MainPID"] != first["MainPID"] and alive(int(again["MainPID"]))
    log = journalctl(root, "-u", "keeper", "-o", "cat").stdout.splitlines()
    assert log[-4:] == ["keeper.service: Main process exited, code=killed, status=9/KILL",
                        "keeper.service: Failed with result 'signal'.",
                        "keeper.service: Scheduled restart job, restart counter is at 1.",
                        "Started keeper.service - test keeper."]

    out = systemctl(root, "disable", "--now", "keeper")
    assert out.returncode == 0 and f'Removed "{link}".' in out.stderr
    assert not link.exists() and not alive(int(again["MainPID"]))
    assert (systemctl(root, "is-active", "keeper").returncode, systemctl(root, "is-enabled", "keeper").stdout) == \
        (3, "disabled\n")
    time.sleep(1.5)  # past RestartSec: a stopped unit is not restarted
    assert show(root, "keeper")["ActiveState"] == "inactive"


def test_exit_codes_and_words_of_an_unknown_unit(root):
    assert (systemctl(root, "start", "nope").returncode, systemctl(root, "start", "nope").stderr) == \
        (5, "Failed to start nope.service: Unit nope.service not found.\n")
    assert (systemctl(root, "is-active", "nope").returncode, systemctl(root, "is-active", "nope").stdout) == \
        (3, "inactive\n")
    assert systemctl(root, "is-active", "--quiet", "nope").stdout == ""
    assert systemctl(root, "status", "nope").returncode == 4
    assert systemctl(root, "stop", "nope").returncode == 5
    assert systemctl(root, "is-enabled", "nope").returncode == 1
    assert systemctl(root, "enable", "nope").stderr == "Failed to enable unit: Unit file nope.service does not exist.\n"


def test_what_is_not_emulated_fails_loudly(root):
    for args in (("list-units",), ("--user", "start", "x"), ("start", "x.timer")):
        out = systemctl(root, *args)
        assert out.returncode == 1 and "emulated by sparkcluster sim" in out.stderr, args
    write_unit(root, "noexec", "Restart=always")
    out = systemctl(root, "start", "noexec")
    assert out.returncode == 1 and "Unit noexec.service has a bad unit file setting." in out.stderr
    assert "Service has no ExecStart=" in journalctl(root, "-u", "noexec").stdout


def test_on_failure_restarts_a_failure_only_and_a_crash_loop_hits_the_start_limit(root):
    write_unit(root, "clean", "ExecStart=/bin/sh -c 'echo bye; exit 0'\nRestart=on-failure\nRestartSec=0")
    assert systemctl(root, "start", "clean").returncode == 0
    assert wait_for(lambda: show(root, "clean")["ActiveState"] == "inactive", 3)
    assert show(root, "clean")["NRestarts"] == "0"
    assert journalctl(root, "-u", "clean", "-o", "cat").stdout.splitlines()[-3:] == [
        "bye", "clean.service: Main process exited, code=exited, status=0/SUCCESS",
        "clean.service: Deactivated successfully."]

    write_unit(root, "crash", "ExecStart=/bin/false\nRestart=on-failure\nRestartSec=0")
    assert systemctl(root, "start", "crash").returncode == 0
    failed = wait_for(lambda: (s := show(root, "crash"))["ActiveState"] == "failed" and s, 5)
    # five starts in StartLimitIntervalSec (10 s): the fifth restart is scheduled, then refused, as systemd logs it
    assert failed and failed["Result"] == "start-limit-hit" and failed["NRestarts"] == "5", show(root, "crash")
    assert journalctl(root, "-u", "crash", "-o", "cat").stdout.splitlines()[-4:] == [
        "crash.service: Scheduled restart job, restart counter is at 5.",
        "crash.service: Start request repeated too quickly.", "crash.service: Failed with result 'start-limit-hit'.",
        "Failed to start crash.service - test crash."]
    assert systemctl(root, "is-failed", "crash").returncode == 0
    status = systemctl(root, "status", "crash")
    assert status.returncode == 3 and status.stdout.startswith("\u00d7 crash.service - test crash\n")
    assert "Active: failed (failed) (Result: start-limit-hit) since " in status.stdout


def test_stop_waits_timeout_stop_sec_then_kills_the_whole_group(root):
    # the main process and the child it leaves behind both ignore SIGTERM: only SIGKILL ends them
    write_unit(root, "stubborn", "ExecStart=/bin/sh -c 'trap \"\" TERM; sleep 1000 & exec sleep 999'\n"
                                 "TimeoutStopSec=1s\nKillMode=control-group")
    assert systemctl(root, "start", "stubborn").returncode == 0
    main = int(show(root, "stubborn")["MainPID"])
    child = wait_for(lambda: [int(p) for p in os.listdir("/proc") if p.isdigit() and alive(int(p))
                              and Path(f"/proc/{p}/cmdline").read_bytes() == b"sleep\x001000\x00"
                              and os.getsid(int(p)) == main], 3)
    assert child
    began = time.monotonic()
    assert systemctl(root, "stop", "stubborn").returncode == 0
    took = time.monotonic() - began
    assert 1 <= took < 5, took
    assert not alive(main) and not any(alive(p) for p in child)
    log = journalctl(root, "-u", "stubborn", "-o", "cat").stdout
    assert "stubborn.service: State 'stop-sigterm' timed out. Killing." in log
    assert log.endswith("Stopped stubborn.service - test stubborn.\n")


def test_service_runs_as_user_with_its_environment(root, tmp_path):
    env_file = tmp_path / "svc.env"
    env_file.write_text("# comment\nFROM_FILE='file value'\nB=from-file\n")
    write_unit(root, "who", f"User=nobody\nEnvironment=\"A=a b\" B=unit\nEnvironmentFile={env_file}\n"
                            f"EnvironmentFile=-/nonexistent\nExecStart=/bin/sh -c 'echo $(id -un) $HOME "
                            f"[$A] [$B] [$FROM_FILE] $PWD; exec sleep 1000'")
    assert systemctl(root, "start", "who").returncode == 0
    line = wait_for(lambda: [x for x in journalctl(root, "-u", "who", "-o", "cat").stdout.splitlines()
                             if x.startswith("nobody")], 3)
    home = Path(os.path.expanduser("~nobody"))
    assert line == [f"nobody {home} [a b] [unit] [file value] /"]
    short = journalctl(root, "-u", "who.service", "-n", "1").stdout
    assert re.fullmatch(r"[A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d \S+ sh\[\d+\]: nobody .*\n", short), short
    assert systemctl(root, "stop", "who").returncode == 0


def test_a_restart_keeps_the_loaded_unit_until_daemon_reload(root):
    write_unit(root, "conf", "ExecStart=/bin/sh -c 'echo one; exec sleep 1000'")
    assert systemctl(root, "start", "conf").returncode == 0
    write_unit(root, "conf", "ExecStart=/bin/sh -c 'echo two; exec sleep 1000'")
    out = systemctl(root, "restart", "conf")
    assert out.returncode == 0 and "changed on disk. Run 'systemctl daemon-reload'" in out.stderr
    assert systemctl(root, "daemon-reload").returncode == 0
    assert systemctl(root, "restart", "conf").returncode == 0
    said = wait_for(lambda: [x for x in journalctl(root, "-u", "conf", "-o", "cat").stdout.splitlines()
                             if x in ("one", "two")] == ["one", "one", "two"], 3)
    assert said, journalctl(root, "-u", "conf", "-o", "cat").stdout
    assert systemctl(root, "stop", "conf").returncode == 0


def test_a_changing_verb_waits_for_the_one_before_it(root):
    """One job at a time, as systemd runs them: two starts side by side must not give a unit two runners."""
    write_unit(root, "once", "ExecStart=/bin/sleep 1000")
    (root / "run/sim-systemd").mkdir(parents=True)
    env = {"SIM_SYSTEMD_ROOT": str(root), "PATH": "/usr/bin:/bin"}
    with open(root / "run/sim-systemd/jobs.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another systemctl's job in progress
        start = subprocess.Popen(["/usr/bin/python3", str(HOST / "systemctl"), "start", "once"], env=env)
        time.sleep(1)
        assert start.poll() is None and not (root / "run/sim-systemd/once.pid").exists()
    assert start.wait(timeout=60) == 0 and show(root, "once")["ActiveState"] == "active"
    assert systemctl(root, "start", "once").returncode == 0  # a no-op: it runs
    assert journalctl(root, "-u", "once", "-o", "cat").stdout == "Started once.service - test once.\n"
    assert systemctl(root, "stop", "once").returncode == 0


def test_oneshot_start_waits_for_its_commands_and_remain_after_exit_keeps_it_active(root, tmp_path):
    mark = tmp_path / "mark"
    write_unit(root, "cap", f"Type=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sleep 0.5\n"
                            f"ExecStart=/bin/sh -c 'echo capped > {mark}'")
    began = time.monotonic()
    assert systemctl(root, "start", "cap").returncode == 0
    assert time.monotonic() - began >= 0.5 and mark.read_text() == "capped\n"  # done before start returned
    assert (show(root, "cap")["ActiveState"], show(root, "cap")["SubState"]) == ("active", "exited")
    assert systemctl(root, "stop", "cap").returncode == 0 and show(root, "cap")["ActiveState"] == "inactive"
    assert journalctl(root, "-u", "cap", "-o", "cat").stdout.splitlines()[-3:] == [
        "Finished cap.service - test cap.", "cap.service: Deactivated successfully.", "Stopped cap.service - test cap."]

    write_unit(root, "once", "Type=oneshot\nExecStart=/bin/true")
    assert systemctl(root, "start", "once").returncode == 0 and show(root, "once")["ActiveState"] == "inactive"
    write_unit(root, "broken", "Type=oneshot\nExecStart=/bin/false\nExecStart=/bin/touch /never")
    out = systemctl(root, "start", "broken")
    assert out.returncode == 1 and out.stderr.startswith("Job for broken.service failed because the control process")
    assert systemctl(root, "is-failed", "broken").returncode == 0 and not Path("/never").exists()


def test_boot_starts_the_enabled_units_only(root):
    write_unit(root, "wanted", "ExecStart=/bin/sleep 1000")
    write_unit(root, "unwanted", "ExecStart=/bin/sleep 1000")
    assert systemctl(root, "enable", "wanted").returncode == 0
    # an enabled unit of the real machine's (a link into /lib/systemd/system), where the host's dir is not opaque
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/machine.service").write_text("[Service]\nExecStart=/bin/sleep 1000\n")
    (root / "etc/systemd/system/machine.service").symlink_to(root / "usr/lib/machine.service")
    (root / "etc/systemd/system/multi-user.target.wants/machine.service").symlink_to(root / "usr/lib/machine.service")
    assert systemctl(root, "__boot").returncode == 0
    assert [show(root, n)["ActiveState"] for n in ("wanted", "unwanted", "machine")] == ["active", "inactive",
                                                                                         "inactive"]
    assert systemctl(root, "stop", "wanted").returncode == 0


def test_the_host_gets_the_tools_and_a_unit_directory_of_its_own(tmp_path):
    assert all((HOST / tool).is_file() and os.access(HOST / tool, os.X_OK) for tool in SYSTEMD)
    assert machine.opaque_dir_in_upper(tmp_path, "/etc/systemd/system")
    made = tmp_path / "etc/systemd/system"
    # overlayfs hides the real machine's units (and their enabled links) under it
    assert os.getxattr(made, "trusted.overlay.opaque") == b"y"
    assert (made.parent.stat().st_mode & 0o7777) == (Path("/etc/systemd").stat().st_mode & 0o7777)
