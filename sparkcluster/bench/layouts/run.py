"""A `bench --layouts` run on a connected cluster: the model staged once, then each layout not measured yet served
through serve's own phases (serving/phases.py: the same staging check, Ray, probe, launch and readiness; the compile
caches stay warm between layouts) and measured by the method bench's flags pick (methods.py: the closed loop's
sweep, or llama-benchy's cells), run as the one shell runs it against the endpoint serve recorded, with the receipt
`bench` writes: that layout's serve record and command line, the /metrics deltas over its measurement, and the
nodes' facts, read once for the run. Each layout measured is written to the state at once, so a run cut short (a
failure, Ctrl-C) resumes at the next layout without serving a measured one again."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...engine.errors import EXIT_INTERRUPTED
from ...engine.session import Session
from ...serving.fit import replica_fit
from ...serving.layout import Layout, LayoutKind
from ...serving.phases import ServeOptions, hub_model, serve, stage_model
from ...serving.progress import Emit as ServeEmit
from ..methods.llama_benchy import head_tokenizer
from ..receipt_sources import NodesRead
from ..target import from_cluster
from .choice import refused_as
from .methods import LayoutsMethod, Swept
from .state import LayoutState, Measured


@dataclass(frozen=True)
class Planned:
    """A layout to measure, with serve's options for it, sized on the selected nodes before anything connected."""

    kind: LayoutKind
    layout: Layout
    options: ServeOptions


# What serves a layout (its phases' seconds) and what measures the endpoint then served: serve's phases and bench's
# method on a cluster, fakes in the unit tests.
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
        state.record(Measured(item.kind, item.layout, swept.rows, swept.server, swept.server_version,
                              round(served - began, 3), round(time.monotonic() - served, 3), phases,
                              swept.vllm_build, swept.receipt, swept.benchmarks))


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


def measure_on(session: Session, method: LayoutsMethod, plan: object, args: argparse.Namespace) -> Measure:
    """The method run against the endpoint serve recorded on the head (the router's, for replicas), as the shell
    runs it, and its receipt: the serve record read after each layout's serve, the nodes' comm env and facts once
    (no serve changes them). A failure or Ctrl-C ends the run here: the layout cut short is not recorded."""
    nodes: list[NodesRead] = []  # read with the first layout measured, shared by the rest
    tokenizer: list[Path | None] = []  # the served model's, fetched from the head once where the method wants it

    def measure(item: Planned) -> Swept:
        target = from_cluster(session, nodes[0] if nodes else None)
        if target.served and not nodes:
            nodes.append(NodesRead(target.served.comm_env, target.served.nodes))
        if not tokenizer:
            tokenizer.append(head_tokenizer.for_target(session, target.config, args.tokenizer)
                             if method.method.tokenizer else None)
        measured = method.method.run(plan, args, target, tokenizer[0])
        if measured.failure:
            raise measured.failure
        if measured.code == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        return method.swept(measured, target.served.vllm_build if target.served else None)
    return measure
