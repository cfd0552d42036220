"""engine/locks.py's shell, run by a real local shell as a node runs it: the first run holds the lock while its
stdin stays open, a second is refused with the first one's words, the lock is free once the holder's stdin
closes, and a node without flock says so instead of looking busy."""

from __future__ import annotations

import os
import shutil
import subprocess

from sparkcluster.engine.locks import BUSY, LOCKED, hold_command


def start(home: str, holder: str, path: str | None = None) -> subprocess.Popen:
    command = hold_command("stage-models--acme--x", holder)
    env = {"HOME": home, "PATH": path or os.environ["PATH"]}
    process = subprocess.Popen(["/bin/sh", "-c", command.line()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdin is not None and command.stdin
    try:
        process.stdin.write(command.stdin)
        process.stdin.flush()
    except BrokenPipeError:  # it answered and ended without reading (no flock): its answer is still there
        pass
    return process


def answer(process: subprocess.Popen) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


def test_a_lock_is_held_while_its_stdin_is_open_and_a_second_run_reads_who_holds_it(tmp_path):
    first = start(str(tmp_path), "`sparkcluster stage acme/x` (pid 11)")
    try:
        assert answer(first) == LOCKED
        second = start(str(tmp_path), "`sparkcluster stage acme/x` (pid 22)")
        assert answer(second) == f"{BUSY} `sparkcluster stage acme/x` (pid 11)"
        assert second.wait(timeout=10) == 0
    finally:
        first.stdin.close()  # the run ends: its SSH channel, and so the lock, goes with it
        first.wait(timeout=10)
    third = start(str(tmp_path), "`sparkcluster stage acme/x` (pid 33)")
    assert answer(third) == LOCKED
    third.stdin.close()
    third.wait(timeout=10)


def test_a_node_without_flock_says_so(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mkdir", "head", "cat"):  # what the line needs, less flock
        os.symlink(shutil.which(tool), bin_dir / tool)
    process = start(str(tmp_path), "me", path=str(bin_dir))
    assert answer(process) == "flock is not installed"
    process.wait(timeout=10)
