"""What bench reports alongside a method's own figures, whichever method measured them: the decode budget (the
all-reduce share of a decode step, against the ITL the method measured at each concurrency) and each node's GPU as
the run ended. One value, read once, which each method places where its output allows: the closed loop in its JSON
document and under its table; llama-benchy under its `sparkcluster` key and under its markdown table, its own keys,
table and CSV left exactly as llama-benchy writes them. Where `monitor up` runs Prometheus, also what it saw of the
endpoint during the run (its range over the run's seconds: tokens/s, TTFT and ITL quantiles), read over the same
connection as the GPUs; nothing where it is not up."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.cliapp import Connect
from ..engine.errors import EXIT_INTERRUPTED, SparkclusterError
from ..node.gputelemetry import GpuTelemetry, read_all, telemetry_json
from ..observe.promrange import PrometheusRange, of_session
from . import decode_budget
from .decode_budget import DecodeBudget

MIN_RANGE_S = 30  # two of monitor's 15 s scrapes: a rate needs two samples in its window


def run_window(seconds: float) -> int:
    """The Prometheus window that covers a run of `seconds` (whole seconds, at least two scrapes)."""
    return max(MIN_RANGE_S, math.ceil(seconds))


def gpus_at_end(args: argparse.Namespace, connect: Connect) -> dict[str, GpuTelemetry | str]:
    """Each node's GPU temperature, power, clock and throttle reasons as the run ends (a throttled node explains a
    slow row); none where the nodes cannot be reached again."""
    return at_end(args, connect, None)[0]


def at_end(args: argparse.Namespace, connect: Connect, run_s: float | None
           ) -> tuple[dict[str, GpuTelemetry | str], PrometheusRange | None]:
    """The GPUs as the run ends and, given the run's length, Prometheus' range over it where `monitor up` runs it
    (one connection for both)."""
    try:
        with connect(args, lambda inventory: None, require_all=False) as session:
            gpus = read_all(session, [h for h in session.hosts if h.name in session.facts])
            return gpus, (of_session(session, run_window(run_s)) if run_s is not None else None)
    except SparkclusterError:
        return {}, None


@dataclass(frozen=True)
class Alongside:
    budget: DecodeBudget | None = None
    gpus: Mapping[str, GpuTelemetry | str] = field(default_factory=dict)
    prometheus: PrometheusRange | None = None  # what the cluster's Prometheus saw during the run (`monitor up`)

    def to_json(self) -> dict[str, Any]:
        """The keys a result's document gains: `decode_budget`, `gpu_at_end` and `prometheus`, each only where
        known."""
        seen = self.prometheus
        return {**({"decode_budget": self.budget.to_json()} if self.budget else {}),
                **({"gpu_at_end": {name: telemetry_json(got) for name, got in self.gpus.items()}}
                   if self.gpus else {}),
                **({"prometheus": {"source": seen.source(), "figures": seen.figures.to_json()}} if seen else {})}

    def budget_text(self) -> str | None:
        return decode_budget.describe(self.budget) if self.budget else None

    def gpu_line(self) -> str | None:
        if not self.gpus:
            return None
        return "GPUs at the end: " + "; ".join(f"{name} {got if isinstance(got, str) else got.summary()}"
                                               for name, got in self.gpus.items())


    def prometheus_line(self) -> str | None:
        """`Prometheus on spark-1 during the run (last 45 s): running 2, ..., generation 41.5 tok/s, ...`."""
        seen = self.prometheus
        if seen is None:
            return None
        return f"Prometheus on {seen.place} during the run (last {seen.window_s} s): {seen.figures.summary()}"


def gather(args: argparse.Namespace, connect: Connect, config: Mapping[str, Any],
           itl_by_concurrency: Sequence[tuple[int, float | None]], code: int, run_s: float | None = None) -> Alongside:
    """The budget from the inputs the target's config carries and the run's ITL (seconds, per concurrency); the GPUs
    and Prometheus' range over the run's `run_s` read over a fresh connection, unless the run was interrupted or
    measured a bare --url (no nodes to ask)."""
    gpus, seen = at_end(args, connect, run_s) if code != EXIT_INTERRUPTED and not args.url else ({}, None)
    return Alongside(decode_budget.for_run(config, itl_by_concurrency), gpus, seen)
