"""Clusters of scripted nodes for serve's tests: the nodes that answer as a served cluster's would, and the commands a
reused serve runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from sparkcluster.engine.command import Command
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.serving.launch import Node

VENV = "/opt/vllm-env"


def cluster(serve_env: dict[str, str] | None = None) -> SimpleNamespace:
    """What vllm_commands reads of a connected session: the hosts, the head and the inventory."""
    hosts = tuple(Host(f"spark-{i}", f"10.0.0.{i}", "head" if i == 1 else "worker",
                       vars={"python_env": VENV}) for i in (1, 2))
    inventory = Inventory(Path("inv.yml"), "t", hosts, {"serve_env": serve_env or {}})
    return SimpleNamespace(hosts=hosts, head=hosts[0], inventory=inventory)


NODES = {f"spark-{i}": Node(f"spark-{i}", i - 1, f"192.168.100.{i}", "192.168.100.1") for i in (1, 2)}


class Files:
    """A transport that only reads files (the comm env), from a dict."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def read_file(self, path: str) -> bytes | None:
        return self.files.get(path)


def session(env2: bytes) -> Session:
    hosts = (Host("spark-1", "10.0.0.1", role="head"), Host("spark-2", "10.0.0.2", role="worker"))
    inventory = Inventory(path=Path("inv.yml"), name="t", hosts=hosts, vars={})
    path = ".config/sparkcluster/comm.env"
    return Session(inventory, transports={"spark-1": Files({path: b"VLLM_HOST_IP=1\n"}),  # type: ignore[dict-item]
                                          "spark-2": Files({path: env2})})


COMMANDS = {"spark-1": Command("docker run ... ray start --head"), "spark-2": Command("docker run ... ray start")}
