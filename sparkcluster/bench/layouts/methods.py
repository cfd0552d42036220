"""Either bench method as `bench --layouts` measures a served layout with it: the Method the shell runs (its plan
made once, before anything connects; its run against each layout's endpoint), with what --layouts keeps of it
beside the layouts' figures: the inputs its state is keyed on, its part of the results' config, the concurrencies
its table shows and, from what a run measured, the layout's record (Swept). The closed loop's keeps its rows (as
before: a state or result written before reads the same); llama-benchy's keeps its `benchmarks` entries."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from ..method import Measured, Method
from ..methods.closed_loop import cli as closed_loop_cli
from ..methods.llama_benchy import cli as llama_benchy_cli
from ..methods.llama_benchy.arithmetic import BenchmarkRun
from ..receipt import Receipt


@dataclass(frozen=True)
class Swept:
    """What measuring a served layout gave: the closed loop's rows (with vLLM's counters beside each) or
    llama-benchy's benchmarks[] entries, the version the endpoint reported, the vLLM build that served (build.py)
    and the receipt of the measurement."""

    rows: tuple[Any, ...]  # closed_loop.arithmetic.Row
    server: tuple[Any, ...]  # metrics.ServerSide | None, beside each row
    server_version: str | None
    vllm_build: str | None
    receipt: Receipt | None = None
    benchmarks: tuple[BenchmarkRun, ...] | None = None  # llama-benchy's; None for the closed loop


class LayoutsMethod(Protocol):
    """A bench Method with what --layouts keeps of it."""

    method: Method[Any]
    name: str

    def plan(self, args: argparse.Namespace) -> Any:
        """The method's plan, from bench's flags as --layouts was given them."""
        ...

    def inputs(self, plan: Any) -> dict[str, Any]:
        """What the figures depend on, of the method's: a state measured otherwise is refused, not resumed."""
        ...

    def config(self, plan: Any) -> dict[str, Any]:
        """The results' config["method"]."""
        ...

    def concurrency(self, plan: Any) -> tuple[int, ...]:
        ...

    def swept(self, measured: Measured, vllm_build: str | None) -> Swept:
        ...


class Sustained:
    """The closed loop: a row per concurrency."""

    name = "sustained"

    def __init__(self) -> None:
        self.method: Method[Any] = closed_loop_cli.ClosedLoop()

    def plan(self, args: argparse.Namespace) -> closed_loop_cli.Plan:
        return closed_loop_cli.plan(args)

    def inputs(self, plan: closed_loop_cli.Plan) -> dict[str, Any]:
        sweep = plan.opts
        return {"concurrency": list(sweep.concurrency), "prompt_tokens": sweep.prompt_tokens if sweep.prompt_given
                else None, "output_tokens": sweep.output_tokens if sweep.output_given else None, "runs": sweep.runs,
                "warmup": sweep.warmup, "requests_per_stream": sweep.requests_per_stream,
                "prefix_cache": sweep.prefix_cache}

    def config(self, plan: closed_loop_cli.Plan) -> dict[str, Any]:
        return {**dataclasses.asdict(plan.opts), "concurrency": list(plan.opts.concurrency)}

    def concurrency(self, plan: closed_loop_cli.Plan) -> tuple[int, ...]:
        return plan.opts.concurrency

    def swept(self, measured: Measured, vllm_build: str | None) -> Swept:
        assert isinstance(measured, closed_loop_cli.Measured)
        levels = measured.levels
        return Swept(tuple(level.row for level in levels), tuple(level.server for level in levels),
                     measured.prepared.server_version, vllm_build, measured.receipt)


class LlamaBenchy:
    """llama-benchy's cells: its grid at every layout, its entries kept as its document holds them."""

    name = "llama-benchy"

    def __init__(self) -> None:
        self.method: Method[Any] = llama_benchy_cli.LlamaBenchy()

    def plan(self, args: argparse.Namespace) -> llama_benchy_cli.Plan:
        # --out is --layouts' folder here, not a profile's (which --layouts refuses)
        return llama_benchy_cli.plan(args, own_out=False)

    def inputs(self, plan: llama_benchy_cli.Plan) -> dict[str, Any]:
        return {"method": self.name, **self.config(plan)}

    def config(self, plan: llama_benchy_cli.Plan) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(plan.opts), "cells": [c.label for c in plan.cells],
                "pp_given": plan.pp_given}

    def concurrency(self, plan: llama_benchy_cli.Plan) -> tuple[int, ...]:
        return tuple(dict.fromkeys(c.concurrency for c in plan.cells))

    def swept(self, measured: Measured, vllm_build: str | None) -> Swept:
        assert isinstance(measured, llama_benchy_cli.Measured)
        receipt = measured.receipt
        return Swept((), (), receipt.engine.vllm_version, vllm_build, receipt, tuple(measured.runs))


def for_flags(args: argparse.Namespace) -> LayoutsMethod:
    """The method bench's flags pick, as cli.py picks it for one endpoint."""
    return LlamaBenchy() if args.method == "llama-benchy" else Sustained()
