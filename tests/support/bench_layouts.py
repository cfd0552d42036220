"""bench --layouts's tests' cluster: scripted serving, the layouts planned and measured, a result row and the inventory
file."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest

from sparkcluster.bench.layouts import cli as layouts_cli
from sparkcluster.bench.layouts import state
from sparkcluster.bench.layouts.run import Planned, Swept
from sparkcluster.bench.methods.closed_loop.arithmetic import Distribution, Row
from sparkcluster.bench.metrics import ServerSide
from sparkcluster.engine.cliapp import selected_inventory
from sparkcluster.engine.errors import SparkclusterError
from sparkcluster.serving.layout import Layout
from sparkcluster.serving.phases import ServeOptions

TP2, PP2, TWO_REPLICAS = Layout(1, 2, 1), Layout(1, 1, 2), Layout(2, 1, 1)


def inventory_file(tmp_path: Path, count: int) -> Path:
    hosts = "".join(f"  spark-{i}: {{address: 192.168.1.{10 + i}, role: {'head' if i == 1 else 'worker'}}}\n"
                    for i in range(1, count + 1))
    path = tmp_path / "inv.yml"
    path.write_text(f"name: t\nvars: {{user: spark}}\nhosts:\n{hosts}")
    return path


def row(c: int, tps: float, ttft: float, itl: float, errors: int = 0) -> Row:
    def d(v: float) -> Distribution:
        return Distribution(v, v, v, v)
    return Row(c, 100.0, tps, tps * 1.2, d(ttft), d(itl), d(ttft + 8 * itl), 4 * c, 64 * c, 32 * c, errors)


def measured(kind: str, layout: Layout, rows: list[Row], build: str | None = "0.11.0+cu130") -> state.Measured:
    return state.Measured(state.kind(kind), layout, tuple(rows), tuple(None for _ in rows), "0.11.0", 60.0, 20.0,
                          {"launch": 5.0, "ready": 50.0}, build)


INPUTS = {"nodes": ["spark-1", "spark-2"], "model": "org/m", "concurrency": [1, 8]}


def planned(*kinds: str) -> list[Planned]:
    layouts = {"tp": TP2, "pp": PP2, "replicas": TWO_REPLICAS}
    return [Planned(state.kind(k), layouts[k], ServeOptions()) for k in kinds]


class Cluster:
    """serve and measure as the run calls them: which layouts were served, and a failure on demand."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.served: list[str] = []
        self.fail_on = fail_on

    def serve(self, item: Planned) -> dict[str, float]:
        if item.kind == self.fail_on:
            raise SparkclusterError(f"{item.kind}: vLLM did not start", "read its log")
        self.served.append(item.kind)
        return {"launch": 1.0}

    def measure(self, item: Planned) -> Swept:
        assert item.kind == self.served[-1]  # what was just served
        tps = 50.0 * len(self.served)
        return Swept((row(1, tps, 0.1, 0.02),), (ServerSide(0.1, None, 0, 32, 64),), "0.32.0", "0.32.0+cpu")


def on_cluster(monkeypatch: pytest.MonkeyPatch, cluster: Cluster, staged_s: float):
    """`bench --layouts`' command wired to `cluster` (serve and measure) in place of a connected one; its `connect`."""
    @contextmanager
    def connect(args, check, require_all=True):
        check(selected_inventory(args))  # the layouts sized and the state read, as before a real connection
        yield object()

    monkeypatch.setattr(layouts_cli, "one_at_a_time", lambda session: nullcontext())
    monkeypatch.setattr(layouts_cli, "stage_once", lambda session, todo, emit: staged_s)
    monkeypatch.setattr(layouts_cli, "serve_on", lambda session, emit: cluster.serve)
    monkeypatch.setattr(layouts_cli, "measure_on", lambda session, method, plan, args: cluster.measure)
    return connect
