"""A `bench --layouts` run on a connected cluster: the model staged once, then each layout not measured yet served
through serve's own phases (serving/phases.py: the same staging check, Ray, probe, launch and readiness; the compile
caches stay warm between layouts) and measured by bench's own sweep against the endpoint serve recorded, with the
receipt `bench` writes (methods/closed_loop/receipt.py): that layout's serve record and command line, the /metrics
deltas over its sweep, and the nodes' facts, read once for the run. Each layout measured is written to the state at
once, so a run cut short (a failure, Ctrl-C) resumes at the next layout without serving a measured one again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...engine.session import Session
from ...serving.fit import replica_fit
from ...serving.layout import Layout, LayoutKind
from ...serving.phases import ServeOptions, hub_model, serve, stage_model
from ...serving.progress import Emit as ServeEmit
from ..methods.closed_loop.receipt import sustained_parameters, sweep_receipt
from ..methods.closed_loop.sweep import Emit as SweepEmit
from ..methods.closed_loop.sweep import Level, Prepared, SweepOptions, sweep
from ..receipt import Receipt
from ..receipt_sources import NodesRead
from ..target import from_cluster
from .choice import refused_as
from .state import LayoutState, Measured


@dataclass(frozen=True)
class Planned:
    """A layout to measure, with serve's options for it, sized on the selected nodes before anything connected."""

    kind: LayoutKind
    layout: Layout
    options: ServeOptions


@dataclass(frozen=True)
class Swept:
    """What measuring a served layout gave: a level per concurrency, what the sweep learnt of the server, the
    vLLM build that served (build.py) and the receipt of the measurement."""

    levels: list[Level]
    prepared: Prepared
    vllm_build: str | None
    receipt: Receipt | None = None


# What serves a layout (its phases' seconds) and what measures the endpoint then served: serve's phases and bench's
# sweep on a cluster, fakes in the unit tests.
ServeLayout = Callable[[Planned], dict[str, float]]
Measure = Callable[[Planned], Swept]
Say = Callable[[str], None]


def measure_layouts(planned: Sequence[Planned], state: LayoutState, serve_layout: ServeLayout, measure: Measure,
                    say: Say) -> None:
    """Each planned layout the state does not hold yet, served then measured, recorded as soon as measured."""
    for item in planned:
        if item.kind in state.done:
            say(f"{item.kind} ({item.layout.describe()}): measured before, kept from {state.path}")
            continue
        say(f"{item.kind}: serving {item.layout.describe()} ...")
        began = time.monotonic()
        phases = serve_layout(item)
        served = time.monotonic()
        say(f"{item.kind}: measuring ...")
        swept = measure(item)
        state.record(Measured(item.kind, item.layout, tuple(level.row for level in swept.levels),
                              tuple(level.server for level in swept.levels), swept.prepared.server_version,
                              round(served - began, 3), round(time.monotonic() - served, 3), phases,
                              swept.vllm_build, swept.receipt))


def stage_once(session: Session, todo: Sequence[Planned], emit: ServeEmit) -> float:
    """The model on every node before the first layout, as serve stages it (each serve after finds it there), and
    every replicas layout checked to hold it before any is served (a refusal after an hour of other layouts helps no
    one); the seconds it took."""
    began = time.monotonic()
    args = todo[0].options.serve_args()
    model = hub_model(args)
    if model is not None:
        stage_model(session, model, emit)
    for item in todo:
        if item.layout.routed:
            with refused_as(item.kind, item.layout):
                replica_fit(session, args.model, item.layout, args.flags)
    return round(time.monotonic() - began, 3)


def serve_on(session: Session, emit: ServeEmit) -> ServeLayout:
    return lambda item: serve(session, item.options, emit).phases


def sweep_on(session: Session, options: SweepOptions, emit: SweepEmit) -> Measure:
    """Bench's sweep against the endpoint serve recorded on the head (the router's, for replicas), and its receipt:
    the serve record read after each layout's serve, the nodes' comm env and facts once (no serve changes them)."""
    nodes: list[NodesRead] = []  # read with the first layout measured, shared by the rest

    def measure(item: Planned) -> Swept:
        target = from_cluster(session, nodes[0] if nodes else None)
        if target.served and not nodes:
            nodes.append(NodesRead(target.served.comm_env, target.served.nodes))
        levels: list[Level] = []
        prepared = Prepared()
        asyncio.run(sweep(target.base_url, target.model, options, levels, prepared, emit, target.api_key,
                          target.engine_metrics))
        receipt = sweep_receipt(target, prepared, sustained_parameters(prepared.options or options, prepared))
        return Swept(levels, prepared, target.served.vllm_build if target.served else None, receipt)
    return measure
