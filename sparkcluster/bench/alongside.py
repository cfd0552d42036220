"""What bench reports alongside a method's own figures, whichever method measured them: the decode budget (the
all-reduce share of a decode step, against the ITL the method measured at each concurrency) and each node's GPU as
the run ended. One value, read once, which each method places where its output allows: the closed loop in its JSON
document and under its table; llama-benchy under its `sparkcluster` key and under its markdown table, its own keys,
table and CSV left exactly as llama-benchy writes them."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.cliapp import Connect
from ..engine.errors import EXIT_INTERRUPTED, SparkclusterError
from ..node.gputelemetry import GpuTelemetry, read_all, telemetry_json
from . import decode_budget
from .decode_budget import DecodeBudget


def gpus_at_end(args: argparse.Namespace, connect: Connect) -> dict[str, GpuTelemetry | str]:
    """Each node's GPU temperature, power, clock and throttle reasons as the run ends (a throttled node explains a
    slow row); none where the nodes cannot be reached again."""
    try:
        with connect(args, lambda inventory: None, require_all=False) as session:
            return read_all(session, [h for h in session.hosts if h.name in session.facts])
    except SparkclusterError:
        return {}


@dataclass(frozen=True)
class Alongside:
    budget: DecodeBudget | None = None
    gpus: Mapping[str, GpuTelemetry | str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The keys a result's document gains: `decode_budget` and `gpu_at_end`, each only where known."""
        return {**({"decode_budget": self.budget.to_json()} if self.budget else {}),
                **({"gpu_at_end": {name: telemetry_json(got) for name, got in self.gpus.items()}}
                   if self.gpus else {})}

    def budget_text(self) -> str | None:
        return decode_budget.describe(self.budget) if self.budget else None

    def gpu_line(self) -> str | None:
        if not self.gpus:
            return None
        return "GPUs at the end: " + "; ".join(f"{name} {got if isinstance(got, str) else got.summary()}"
                                               for name, got in self.gpus.items())


def gather(args: argparse.Namespace, connect: Connect, config: Mapping[str, Any],
           itl_by_concurrency: Sequence[tuple[int, float | None]], code: int) -> Alongside:
    """The budget from the inputs the target's config carries and the run's ITL (seconds, per concurrency); the GPUs
    read over a fresh connection, unless the run was interrupted or measured a bare --url (no nodes to ask)."""
    gpus = gpus_at_end(args, connect) if code != EXIT_INTERRUPTED and not args.url else {}
    return Alongside(decode_budget.for_run(config, itl_by_concurrency), gpus)
