"""What the supervisor does, only through serving's own commands, so a restart is exactly a serve: `sparkcluster
serve` with the flags the serve was asked with, on the head's inventory (a degraded serve: --limit to the nodes
left, and the largest layout that fits there), and a replica's engine started again alone, by the start command
serve gives it, while the router serves the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..engine.errors import SparkclusterError
from ..engine.inventory import load_inventory
from ..engine.locks import Busy
from ..engine.secret_names import masked_argv
from ..engine.session import connected
from ..serving.cli import serve_lock, served_options
from ..serving.record import read_record
from ..serving.replica import restart_replica as restart_replica_of
from ..serving.supervisor_unit import SUPERVISED_ENV, SupervisorSpec, without_flags

LAYOUT_FLAGS = ("--tp", "--pp", "--replicas", "--limit")


@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    cause: str | None  # the serve's own error (its first line), where it failed
    busy: bool = False  # a serve or down by hand holds the cluster's lock: not a failure of ours
    phases: dict[str, float] | None = None  # the serve's own phases (its --json), what the recovery was made of


def serve_argv(spec: SupervisorSpec, inventory: Path, survivors: Sequence[str] | None = None,
               tp: int | None = None, replicas: int | None = None) -> list[str]:
    """The serve to run: as asked, or, degraded, limited to `survivors` with the layout that fits on them."""
    own = list(spec.serve_argv)
    if survivors is not None:
        own = without_flags(own, LAYOUT_FLAGS)
        own += ["--limit", ",".join(survivors)]
        own += ["--tp", str(tp)] if tp else []
        own += ["--replicas", str(replicas)] if replicas else []
    tail = ["--", *spec.remote] if spec.remote else []
    return [sys.executable, "-m", "sparkcluster", "serve", "-i", str(inventory), "--json", *own, *tail]


def run_serve(argv: list[str], timeout_s: float, log: Path) -> Outcome:
    """Runs the serve, its output appended to the supervisor's log; its error (exit 1 or 2) is the root cause."""
    start = time.monotonic()
    env = {**os.environ, SUPERVISED_ENV: "1"}
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(masked_argv(argv[3:]))}\n".encode())
        out.flush()
        try:
            done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Outcome(False, time.monotonic() - start, f"the serve did not finish within {timeout_s:.0f} s")
        out.write(done.stdout[-4000:] + done.stderr[-8000:])
    seconds = time.monotonic() - start
    if done.returncode == 0:
        return Outcome(True, seconds, None, phases=_phases(done.stdout))
    said = done.stderr.decode(errors="replace")
    return Outcome(False, seconds, first_error(said), busy="is already running there" in " ".join(said.split()))


def restart_replica(spec: SupervisorSpec, inventory_path: Path, index: int, log: Path) -> Outcome:
    """Replica `index` of the recorded serve started again alone (serving/replica.py), timed; its error the cause."""
    start = time.monotonic()
    try:
        inventory = load_inventory(inventory_path)
        opts = served_options(list(spec.serve_argv), list(spec.remote), inventory)
        with connected(inventory) as session, serve_lock(session):
            record = read_record(session)
            placement = next(p for p in (record.serving.replicas if record and record.serving else ())
                             if p.index == index)
            restart_replica_of(session, opts, placement)
    except (SparkclusterError, StopIteration) as e:
        cause = e.message if isinstance(e, SparkclusterError) else f"replica {index} is not in the serve record"
        if isinstance(e, Busy):
            return Outcome(False, time.monotonic() - start, cause, busy=True)
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"replica {index} restart failed: {cause}\n")
        return Outcome(False, time.monotonic() - start, cause)
    return Outcome(True, time.monotonic() - start, None)


def _phases(stdout: bytes) -> dict[str, float] | None:
    try:
        phases = json.loads(stdout)["phases"]
    except (ValueError, KeyError, TypeError):
        return None
    return {str(k): float(v) for k, v in phases.items()} if isinstance(phases, dict) else None


def first_error(stderr: str) -> str:
    """The serve's error as it printed it: the line after "error:" and what follows, one line, bounded."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.lower().startswith("error"):
            return " ".join([line.removeprefix("error:").strip(), *lines[i + 1:i + 3]])[:500]
    return (lines[-1] if lines else "the serve failed and said nothing")[:500]
