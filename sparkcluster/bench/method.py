"""A bench method, as the one shell (shell.py) drives it: its flags turned into a typed plan before anything
connects (a UsageError, exit 2, otherwise), then `run` against the target, which returns what was measured so far
even on a failure or Ctrl-C (its exit code and failure with it) and the receipt of its parameters; the measurement
gives its own panels: the JSON document, the table, the CSV and the plot. Two methods implement it: the closed loop
(methods/closed_loop/) and llama-benchy's (methods/llama_benchy/); neither is imported here."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..engine.errors import EXIT_INTERRUPTED, SparkclusterError, UsageError
from .alongside import Alongside
from .receipt import Receipt
from .target import Target

PlanT = TypeVar("PlanT")


class Measured(Protocol):
    """What a run measured (its rows so far), how it ended and the receipt of its parameters, with its panels."""

    @property
    def code(self) -> int:
        """EXIT_OK, the failure's exit code, or EXIT_INTERRUPTED."""
        ...

    @property
    def failure(self) -> SparkclusterError | None: ...

    @property
    def target(self) -> Target:
        """The endpoint measured (its model as the run resolved it)."""
        ...

    @property
    def receipt(self) -> Receipt: ...

    def any(self) -> bool:
        """Whether anything was measured: the table, CSV and plot need a row."""
        ...

    def itl(self) -> Sequence[tuple[int, float | None]]:
        """The median ITL (s) at each concurrency, for the decode budget bench reports alongside."""
        ...

    def document(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The JSON document, and the part of it where what bench reports alongside goes."""
        ...

    def table(self, extra: Alongside) -> None:
        """The table on stdout, with what goes under it."""
        ...

    def csv(self, path: Path) -> None: ...

    def plot(self, path: Path) -> None: ...

    def finish(self) -> None:
        """The method's own files, once the outputs every method writes are written."""
        ...

    def done(self) -> str:
        """How far it got, for an interruption: "3 of 7 concurrencies"."""
        ...


class Method(Protocol[PlanT]):
    """A way of loading the endpoint and reading its figures."""

    tokenizer: bool  # whether it wants the served model's tokenizer from the head

    def plan(self, args: argparse.Namespace) -> PlanT:
        """Every flag checked, before anything connects."""
        ...

    def run(self, plan: PlanT, args: argparse.Namespace, target: Target, head_tokenizer: Path | None) -> Measured:
        ...


class Ending(Protocol):
    """Where a run records how it ended."""

    code: int
    failure: SparkclusterError | None


@contextmanager
def ending(measured: Ending, failures: tuple[type[SparkclusterError], ...] = (SparkclusterError,)) -> Iterator[None]:
    """Either method's run: one of `failures`, or Ctrl-C, ends it with what it measured so far kept, the failure
    and its exit code (or 130) recorded for the shell, which prints them after the rows."""
    try:
        yield
    except failures as e:
        measured.failure, measured.code = e, e.exit_code
    except KeyboardInterrupt:
        measured.code = EXIT_INTERRUPTED


def check_timeout(args: argparse.Namespace) -> None:
    """--timeout, which bounds each request of either method."""
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g} is not a duration", "give seconds, e.g. --timeout 600")


def check_outputs(args: argparse.Namespace) -> None:
    """--csv's and --plot's paths, which the shell writes for either method, before any request is sent."""
    for flag, path in (("--csv", args.csv), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: its directory does not exist", "create it, or write elsewhere")
    if args.plot and not args.plot.lower().endswith(".png"):
        raise UsageError(f"--plot {args.plot} is not a .png file", "e.g. --plot bench.png")
