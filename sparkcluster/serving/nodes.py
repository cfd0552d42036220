"""The nodes of a served cluster: the fabric address each binds to (read back from the comm env bootstrap wrote),
and the environment its serving processes get."""

from __future__ import annotations

from collections.abc import Mapping

from ..engine.command import is_secret_name
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host, Inventory
from ..engine.session import Session
from ..engine.transport import remote_path
from ..node.network import cable_order, comm_env_path, rank_order
from .apikey import API_KEY_ENV, environment_key
from .launch import Node
from .runtime import NodeEnv


def read_nodes(session: Session, tp: int = 0) -> dict[str, Node]:
    """Each node's fabric address, as its comm env from bootstrap gives it to Ray and vLLM; the head is rank 0, the
    others ranked along the cables (on a ring each stage's ranks cabled to the next's: node/network.rank_order)."""
    ips: dict[str, str] = {}
    for host in session.hosts:
        path = remote_path(comm_env_path(host))
        data = session.transport(host).read_file(path)
        values = dict(line.split("=", 1) for line in (data or b"").decode().splitlines()
                      if "=" in line and not line.startswith("#"))
        if "VLLM_HOST_IP" not in values:
            raise SparkclusterError(f"{host.name} has no comm env ({path} with VLLM_HOST_IP)",
                                    "run `sparkcluster bootstrap` first: it binds every comm variable to the QSFP link")
        ips[host.name] = values["VLLM_HOST_IP"]
    head_ip = ips[session.head.name]
    order = rank_order(cable_order([h.name for h in session.hosts], session.facts), tp)
    return {name: Node(name, rank, ips[name], head_ip) for rank, name in enumerate(order)}


def node_env(inventory: Inventory, host: Host, extra: Mapping[str, str] | None = None) -> NodeEnv:
    """What a node's serving processes get: its comm env file, the inventory's serve_env (all, then the host's),
    then `extra` (a recipe's env)."""
    env = {"HF_HUB_OFFLINE": "1"}  # the model was staged: never let vLLM download on a node (F15)
    for scope in (inventory.vars, host.vars):
        env.update({str(k): str(v) for k, v in (scope.get("serve_env") or {}).items()})
    env.update(extra or {})
    # vLLM's API key is a secret whatever the rule for names says: it must never reach a command line.
    secrets = {k: v for k, v in env.items() if is_secret_name(k) or k == API_KEY_ENV}
    broken = [k for k, v in secrets.items() if "\n" in v or "\0" in v]  # stdin carries one line per secret
    if broken:
        raise SparkclusterError(f"{host.name}: the value of {broken[0]} holds a line break", "give a secret as one line")
    return NodeEnv(comm_env_path(host), {k: v for k, v in env.items() if k not in secrets}, secrets)


def client_api_key(inventory: Inventory, head: Host) -> str | None:
    """The key a client of the served endpoint sends (`status`, `bench`): this machine's VLLM_API_KEY, else the
    one the inventory gives the head's vLLM (serve_env). A key given to serve by flag is in neither: serve kept it
    nowhere (its record included), so the client is told where to give it when the endpoint answers 401."""
    return environment_key() or node_env(inventory, head).api_key
