"""A play's read-only checks in one exec per host (engine/batch.py, Step.reads): run by a real shell here, each
command's stdout, stderr and exit code come back apart and exactly; the runner sends them as one batch and reads
afresh after anything was applied. A step's changes and the reads of its check after them share one exec too
(HostContext.apply_then_read): a file is written whole or not at all, and read back in that exec."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

import pytest

from sparkcluster.engine.batch import batch_script, run_batch, split_output
from sparkcluster.engine.command import Command
from sparkcluster.engine.events import StepFinished
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.playbook import load_playbook
from sparkcluster.engine.runner import Runner
from sparkcluster.engine.session import Session
from sparkcluster.engine.steps.base import HostContext, StepFailed
from sparkcluster.engine.steps.files import file_state, plan_file, write_command, write_file
from sparkcluster.engine.transport import Result
from sparkcluster.node import steps as _registers_node_steps  # noqa: F401 (hfcache.dir)


class LocalShell:
    """A Transport that runs each command with this machine's sh, counting the execs."""

    sudo_password = None

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.ran: list[str] = []

    def run(self, command: Command) -> Result:
        self.ran.append(command.script)
        start = time.monotonic()
        done = subprocess.run(["sh", "-c", command.line()], capture_output=True, text=True, env=self.env,
                              input=command.stdin, timeout=command.timeout)
        return Result(command, done.returncode, done.stdout, done.stderr, time.monotonic() - start)

    def close(self) -> None:
        pass


COMMANDS = [Command("printf 'no newline'"), Command("echo out; echo err >&2; exit 3"),
            Command("echo '@@sc-batch-0000@@ 1 out'"), Command("true # a comment ends the line"),
            Command("cat; echo stdin was empty"), Command("echo $GREETING", env={"GREETING": "hi there"})]


def test_each_commands_output_comes_back_as_if_it_ran_alone() -> None:
    shell = LocalShell(dict(os.environ))
    results = run_batch(shell, COMMANDS)  # type: ignore[arg-type]
    alone = [shell.run(c) for c in COMMANDS]
    assert results is not None and len(shell.ran) == 1 + len(COMMANDS)
    assert [(r.stdout, r.stderr, r.exit_code) for r in results.values()] == \
        [(r.stdout, r.stderr, r.exit_code) for r in alone]
    assert results[1].command is COMMANDS[1]


def test_a_cut_off_batch_is_no_answer_so_each_step_runs_its_own() -> None:
    text = subprocess.run(["sh", "-c", batch_script(COMMANDS, "@@m@@")], capture_output=True, text=True).stdout
    assert split_output(text, COMMANDS, "@@m@@", 0.1) is not None
    assert split_output(text[: text.rindex("@@m@@ end")], COMMANDS, "@@m@@", 0.1) is None


PLAY = """
plays:
  - name: provision
    gather_facts: false
    steps:
      - hfcache.dir: {}
      - packages.present: {names: [coreutils]}
"""


def run_play(tmp_path: Path, check: bool) -> tuple[LocalShell, list[StepFinished]]:
    (tmp_path / "pb.yml").write_text(PLAY)
    shell = LocalShell({**os.environ, "HF_HOME": str(tmp_path / "hf")})
    inventory = Inventory(Path("inv.yml"), "t", (Host("spark-1", "10.0.0.1", "head"),), {})
    events: list[object] = []
    with Session(inventory, {"spark-1": shell}) as session:  # type: ignore[dict-item]
        Runner(session, load_playbook(tmp_path / "pb.yml"), events.append, check=check).run()
    return shell, [e for e in events if isinstance(e, StepFinished)]


def test_a_plays_checks_are_one_exec(tmp_path: Path) -> None:
    shell, steps = run_play(tmp_path, check=True)
    assert len(shell.ran) == 1, shell.ran
    assert [(s.step, s.status.value) for s in steps] == [("hfcache.dir", "changed"), ("packages.present", "ok")]
    assert steps[0].reason == f"would create {tmp_path / 'hf'}"


def test_after_a_change_the_later_steps_read_afresh(tmp_path: Path) -> None:
    shell, steps = run_play(tmp_path, check=False)
    # The batch; mkdir with hfcache.dir's check after it, in one exec; packages.present's own read, since the
    # batch's may be stale.
    assert len(shell.ran) == 3 and "mkdir -p -- " in shell.ran[1] and "dpkg-query" in shell.ran[2]
    assert (tmp_path / "hf").is_dir()
    assert [(s.step, s.status.value) for s in steps] == [("hfcache.dir", "changed"), ("packages.present", "ok")]
    shell, steps = run_play(tmp_path, check=False)  # converged: one exec again
    assert len(shell.ran) == 1 and [s.status.value for s in steps] == ["ok", "ok"]


def test_a_failed_change_ends_the_batch_and_nothing_after_it_runs(tmp_path: Path) -> None:
    shell = LocalShell(dict(os.environ))
    marker = tmp_path / "ran"
    commands = [Command("true"), Command("echo no >&2; exit 4"), Command(f"touch {marker}"), Command("echo read")]
    results = run_batch(shell, commands, changes=3)  # type: ignore[arg-type]
    assert results is not None and sorted(results) == [0, 1]
    assert (results[1].exit_code, results[1].stderr) == (4, "no\n") and not marker.exists()
    results = run_batch(shell, [Command("true"), Command("echo read")], changes=1)  # type: ignore[arg-type]
    assert results is not None and results[1].stdout == "read\n"


def file_context(tmp_path: Path) -> tuple[LocalShell, HostContext]:
    shell = LocalShell(dict(os.environ))
    inventory = Inventory(Path("inv.yml"), "t", (Host("spark-1", "10.0.0.1", "head"),), {})
    return shell, HostContext(inventory.hosts[0], Session(inventory, {"spark-1": shell}))  # type: ignore[dict-item]


def test_a_file_is_written_whole_and_read_back_in_the_same_exec(tmp_path: Path) -> None:
    shell, ctx = file_context(tmp_path)
    path = str(tmp_path / "new dir" / "comm.env")
    content = "A=1\n" * 5000 + "last line, no newline"
    plan = plan_file(ctx, path, content, "0640")
    assert plan.reason == f"create {path}" and plan.uploads[0].size == len(content)
    shell.ran.clear()
    write_file(ctx, path, content, "0640")
    assert len(shell.ran) == 1  # the write and the read back
    assert Path(path).read_text() == content and Path(path).stat().st_mode & 0o7777 == 0o640
    assert os.listdir(tmp_path / "new dir") == ["comm.env"]  # no temporary file left
    assert plan_file(ctx, path, content, "0640").reason == f"{path} is up to date" and len(shell.ran) == 1
    assert plan_file(ctx, path, content, "0644").reason == f"fix the mode of {path}"


def test_a_write_cut_short_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    shell, ctx = file_context(tmp_path)
    path = tmp_path / "comm.env"
    path.write_text("old\n")
    cut = dataclasses.replace(write_command(str(path), "A=1\nB=2\n", "0644"), stdin="A=1\n")  # the connection cut
    with pytest.raises(StepFailed):
        ctx.apply_then_read([cut], [file_state(str(path))])
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["comm.env"]
    assert file_state(str(path)).line() not in ctx.prefetched
