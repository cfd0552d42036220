"""A play's read-only checks in one exec per host (engine/batch.py, Step.reads): run by a real shell here, each
command's stdout, stderr and exit code come back apart and exactly; the runner sends them as one batch and reads
afresh after anything was applied."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from sparkcluster.engine.batch import batch_script, run_batch, split_output
from sparkcluster.engine.command import Command
from sparkcluster.engine.events import StepFinished
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.playbook import load_playbook
from sparkcluster.engine.runner import Runner
from sparkcluster.engine.session import Session
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
    # The batch; mkdir; hfcache.dir's check after it; packages.present's own read, since the batch's may be stale.
    assert len(shell.ran) == 4 and shell.ran[1].startswith("mkdir -p -- ") and "dpkg-query" in shell.ran[3]
    assert [(s.step, s.status.value) for s in steps] == [("hfcache.dir", "changed"), ("packages.present", "ok")]
    shell, steps = run_play(tmp_path, check=False)  # converged: one exec again
    assert len(shell.ran) == 1 and [s.status.value for s in steps] == ["ok", "ok"]
