"""bench reads each node's GPU telemetry as the run ends, over a fresh connection that does not need every node: the
figures per node (a throttled one named), and a node gone since reads as its reason, never as figures."""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path

from sparkcluster.bench.alongside import gpus_at_end
from sparkcluster.engine.command import Command
from sparkcluster.engine.errors import SparkclusterError
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Result, Unreachable
from sparkcluster.node.gputelemetry import GpuTelemetry

ROWS = {"spark-1": "71, 87.61, 2424, [N/A], 0x0000000000000000\nrc=0\n",
        "spark-2": "92, 95.03, 1534, [N/A], 0x0000000000000040\nrc=0\n"}


class Answering:
    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, command: Command) -> Result:
        if self.name == "spark-3":
            raise Unreachable("spark-3: connection reset", "power it on")
        assert "nvidia-smi --query-gpu=temperature.gpu" in command.script
        return Result(command, 0, ROWS[self.name], "", 0.01)

    def close(self) -> None:
        pass


def connect_to(names: list[str]):
    @contextmanager
    def connect(args, check, require_all=True):
        assert require_all is False  # a node that went away must not stop the others' figures
        hosts = tuple(Host(name=n, address=f"10.0.0.{i}", role="head" if i == 1 else "worker") for i, n in enumerate(names, 1))
        with Session(Inventory(path=Path("inv.yml"), name="t", hosts=hosts, vars={}),
                     {n: Answering(n) for n in names}) as session:
            session.facts.update({n: object() for n in names})  # type: ignore[misc]
            yield session
    return connect


def test_each_nodes_gpu_as_the_run_ends():
    gpus = gpus_at_end(argparse.Namespace(), connect_to(["spark-1", "spark-2", "spark-3"]))
    assert isinstance(gpus["spark-2"], GpuTelemetry) and gpus["spark-2"].summary() == (
        "92 C, 95.0 W, SM 1534 MHz, throttled: hw_thermal_slowdown")
    assert isinstance(gpus["spark-1"], GpuTelemetry) and gpus["spark-1"].throttles == ()
    assert gpus["spark-3"] == "spark-3: connection reset"


def test_no_figures_where_the_nodes_cannot_be_reached_again():
    @contextmanager
    def refused(args, check, require_all=True):
        raise SparkclusterError("no inventory", "give one")
        yield

    assert gpus_at_end(argparse.Namespace(), refused) == {}
