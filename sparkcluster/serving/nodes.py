"""The nodes of a served cluster, as one command sees them: their connections and facts (`Cluster`), the fabric
address each binds to (read back from the comm env bootstrap wrote), the environment its serving processes get,
and the record of what runs (kept on the head, so `status`, `logs` and `down` work from any machine)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TypeVar

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.facts import HostFacts
from ..engine.inventory import Host, Inventory
from ..node.network import choose_for, comm_env_path
from ..engine.parallel import parallel_map
from ..engine.transport import Result, Transport, Unreachable, remote_path
from .launch import Node
from .runtime import NodeEnv

RECORD_FILE = ".config/sparkcluster/serve.json"  # on the head, relative to the login user's home
T = TypeVar("T")


class Cluster:
    """The connected nodes of one command: the inventory's hosts (head first), a transport and the facts of each."""

    def __init__(self, inventory: Inventory, transports: Mapping[str, Transport],
                 facts: Mapping[str, HostFacts]) -> None:
        self.inventory, self.transports, self.facts = inventory, transports, facts
        self.hosts = list(inventory.hosts)
        self.head = inventory.head

    def run(self, host: Host, command: Command) -> Result:
        return self.transports[host.name].run(command)

    def each(self, fn: Callable[[Host], T]) -> list[T]:
        return parallel_map(fn, self.hosts, workers=len(self.hosts), on_abort=self.close)

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

    def fabric_ips(self) -> dict[str, str]:
        """From the facts: the QSFP address each node must use."""
        return {h.name: choose_for(h, self.facts[h.name]).ip for h in self.hosts}

    def other_ips(self) -> dict[str, list[str]]:
        """Every other address of each node: joining Ray on one of these is a misconfiguration to name."""
        fabric = self.fabric_ips()
        return {h.name: [cidr.split("/")[0] for i in self.facts[h.name].interfaces for cidr in i.ipv4
                         if cidr.split("/")[0] != fabric[h.name]] + [h.address] for h in self.hosts}

    def endpoint(self, port: int) -> str:
        return f"http://{self.head.address}:{port}/v1"

    # ---- the record on the head --------------------------------------------------------------------------
    def write_record(self, doc: dict) -> None:
        transport = self.transports[self.head.name]
        transport.run(Command("mkdir -p .config/sparkcluster"))
        transport.write_file_atomic(RECORD_FILE, json.dumps(doc, indent=2).encode(), 0o644)

    def read_record(self) -> dict:
        data = self.transports[self.head.name].read_file(RECORD_FILE)
        return json.loads(data) if data else {}

    def clear_record(self) -> None:
        try:
            self.transports[self.head.name].run(Command.argv(["rm", "-f", RECORD_FILE]))
        except Unreachable:
            pass  # nothing runs on a head that cannot be reached; its stale record is overwritten next time


def read_nodes(cluster: Cluster) -> dict[str, Node]:
    """Each node's fabric address, as its comm env from bootstrap gives it to Ray and vLLM; the head is rank 0."""
    ips: dict[str, str] = {}
    for host in cluster.hosts:
        path = remote_path(comm_env_path(host))
        data = cluster.transports[host.name].read_file(path)
        values = dict(line.split("=", 1) for line in (data or b"").decode().splitlines()
                      if "=" in line and not line.startswith("#"))
        if "VLLM_HOST_IP" not in values:
            raise SparkclusterError(f"{host.name} has no comm env ({path} with VLLM_HOST_IP)",
                                    "run `sparkcluster bootstrap` first: it binds every comm variable to the QSFP link")
        ips[host.name] = values["VLLM_HOST_IP"]
    head_ip = ips[cluster.head.name]
    return {h.name: Node(h.name, rank, ips[h.name], head_ip) for rank, h in enumerate(cluster.hosts)}


def node_env(inventory: Inventory, host: Host, extra: Mapping[str, str] | None = None) -> NodeEnv:
    """What a node's serving processes get: its comm env file, the inventory's serve_env (all, then the host's),
    then `extra` (a recipe's env)."""
    env = {"HF_HUB_OFFLINE": "1"}  # the model was staged: never let vLLM download on a node (F15)
    for scope in (inventory.vars, host.vars):
        env.update({str(k): str(v) for k, v in (scope.get("serve_env") or {}).items()})
    env.update(extra or {})
    return NodeEnv(comm_env_path(host), env)
