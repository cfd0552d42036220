"""`status` and `logs`: what runs on each node, read from the nodes themselves and the record on the head."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.transport import Unreachable
from ..nccl.lastverify import LAST_VERIFY_COMMAND, last_verify
from ..observe.promrange import PrometheusRange, of_session
from ..observe.scrape import EndpointFigures, fetch, figures, summed
from .apikey import unauthorized
from .caches import parse_size, size_command
from .launch import Node
from .layout import Placement
from .membership import judge_members, ray_members
from .nodes import client_api_key, read_nodes
from .readiness import http, served_models
from .record import ServeRecord, Serving, fabric_ips, other_ips, read_record
from .router import listed_workers, worker_problems, worker_url, workers_command
from .runtime import RuntimeChoice
from .supervisor_unit import SupervisorView, read_view

SUMMARY_WINDOW_S = 1.0  # the interval status' one-line endpoint summary covers


class ProcessState(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"


@dataclass(frozen=True)
class RayMembership:
    member: bool
    address: str | None
    gpus: float


@dataclass
class NodeStatus:
    fabric_ip: str | None = None
    processes: dict[str, ProcessState] = field(default_factory=dict)  # role (main, vllm) -> state
    unreachable: str | None = None  # why the node did not answer
    ray: RayMembership | None = None
    cache_bytes: int | None = None  # the node's compile/JIT caches (~/.cache/sparkcluster/jit); None: not read
    last_verify: str | None = None  # the last `verify` verdict this node keeps, as one line; None: never verified

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {} if self.fabric_ip is None else {"fabric_ip": self.fabric_ip}
        doc.update({role: str(state) for role, state in self.processes.items()})
        if self.unreachable is not None:
            doc["main"] = f"unreachable: {self.unreachable}"
        if self.ray is not None:
            doc["ray"] = {"member": self.ray.member, "address": self.ray.address, "gpus": self.ray.gpus}
        if self.cache_bytes is not None:
            doc["cache_bytes"] = self.cache_bytes
        if self.last_verify is not None:
            doc["last_verify"] = self.last_verify
        return doc


@dataclass(frozen=True)
class RayStatus:
    nodes: int = 0
    gpus: float = 0
    problems: tuple[str, ...] = ()
    error: str | None = None  # Ray could not be asked

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        return {"nodes": self.nodes, "gpus": self.gpus, "problems": list(self.problems)}


@dataclass(frozen=True)
class ServerStatus:
    endpoint: str
    model: str
    served_name: str
    health: int  # the HTTP status of /health; 0 when nothing answered
    models: tuple[str, ...]
    figures: EndpointFigures | None = None  # from /metrics over one second, as `top` shows them
    metrics_error: str | None = None
    models_error: str | None = None  # why /v1/models listed nothing (a 401: the key it wants, and where to give it)
    prometheus: PrometheusRange | None = None  # figures: Prometheus' range (`monitor up`), not one second's scrapes

    @property
    def healthy(self) -> bool:
        return self.health == 200


@dataclass(frozen=True)
class ReplicaStatus:
    """One engine behind the router: where it answers, whether it does (its own /health), and its nodes whose vLLM
    does not run (the router's health checks take such a replica out of rotation)."""

    placement: Placement
    endpoint: str
    health: int  # the HTTP status of the replica's /health; 0 when nothing answered
    down: tuple[str, ...] = ()
    figures: EndpointFigures | None = None  # its own /metrics over one second (the router's is one replica in turn)

    @property
    def healthy(self) -> bool:
        return self.health == 200 and not self.down

    def to_json(self) -> dict[str, Any]:
        return {"index": self.placement.index, "nodes": list(self.placement.nodes), "endpoint": self.endpoint,
                "health": self.health, "healthy": self.healthy, "down": list(self.down),
                "figures": None if self.figures is None else self.figures.to_json()}


@dataclass(frozen=True)
class ClusterStatus:
    record: ServeRecord | None
    nodes: dict[str, NodeStatus]
    ray: RayStatus | None = None  # None: no Ray to ask (native launcher, or its head is not running)
    server: ServerStatus | None = None
    error: str | None = None  # the nodes could not be read at all
    replicas: tuple[ReplicaStatus, ...] = ()  # behind the router (server: the router's endpoint); empty: one engine
    # The router's workers against the record (a stranger, a missing replica), read on the head: none is healthy.
    router_problems: tuple[str, ...] = ()
    router_workers: tuple[str, ...] | None = None  # as the router lists them; None: not read
    supervisor: SupervisorView | None = None  # the head's supervisor (supervisor_unit.py); None: not read

    @property
    def healthy(self) -> bool:
        """Something is recorded, every recorded process runs, Ray has no problem and vLLM answers."""
        processes = [s for node in self.nodes.values() for s in node.processes.values()]
        return (self.record is not None and self.error is None
                and not any(node.unreachable for node in self.nodes.values())
                and not (self.ray and self.ray.problems)
                and all(s is ProcessState.RUNNING for s in processes)
                and (self.server is None or self.server.healthy)
                and all(r.healthy for r in self.replicas)
                and not self.router_problems)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"state": self.record.to_json() if self.record else {}}
        if self.error is not None:
            doc["error"] = self.error
        else:
            doc["ray"] = self.ray.to_json() if self.ray else {}
            doc["server"] = {} if self.server is None else {
                "endpoint": self.server.endpoint, "model": self.server.model, "served_name": self.server.served_name,
                "health": self.server.health, "models": list(self.server.models),
                "figures": None if self.server.figures is None else self.server.figures.to_json(),
                **({"source": self.server.prometheus.source()} if self.server.prometheus else {}),
                "metrics_error": self.server.metrics_error, "models_error": self.server.models_error}
            if self.replicas:
                doc["replicas"] = [r.to_json() for r in self.replicas]
            if self.replicas or self.router_workers is not None or self.router_problems:
                doc["router"] = {"workers": None if self.router_workers is None else list(self.router_workers),
                                 "problems": list(self.router_problems)}
        doc["nodes"] = {name: node.to_json() for name, node in self.nodes.items()}
        if self.supervisor is not None:
            doc["supervisor"] = self.supervisor.to_json()
        return doc


def recorded(session: Session, chosen: RuntimeChoice) -> tuple[ServeRecord | None, RuntimeChoice]:
    """What the last `up`/`serve` recorded on the head, and the runtime it used (the flags' where none)."""
    record = read_record(session)
    if record is None:
        return None, chosen
    return record, replace(chosen, name=record.runtime, image=record.image)


def status(session: Session, chosen: RuntimeChoice) -> ClusterStatus:
    """Per node: process state, Ray membership and address, GPUs; the server's health, model, endpoint. A node that
    does not answer is shown so (the others, the server and the supervisor still are): a node off is what a
    degraded serve is serving around."""
    nodes = {h.name: NodeStatus() for h in session.hosts}
    for name, lost in session.unreachable.items():
        nodes[name].unreachable = lost.message
    if session.head.name in session.unreachable:
        return ClusterStatus(None, nodes, error=f"the head {session.head.name} does not answer: "
                                                f"{session.unreachable[session.head.name].message}")
    session = session.only([h.name for h in session.hosts if h.name not in session.unreachable])
    record, runtime = recorded(session, chosen)
    serving = record.serving if record else None
    launcher = record.launcher if record else "ray"
    try:
        fabric = read_nodes(session)
    except SparkclusterError as e:
        return ClusterStatus(record, nodes, error=e.message)
    for host in session.hosts:
        entry = nodes[host.name]
        entry.fabric_ip = fabric[host.name].ip
        roles = node_roles(serving, launcher, host.name == session.head.name)
        try:
            for role in roles:
                alive = replace(runtime.on(host).alive(role), timeout=30)
                entry.processes[role] = ProcessState.RUNNING if session.run(host, alive).ok else ProcessState.STOPPED
            entry.cache_bytes = parse_size(session.run(host, size_command()).stdout)
            entry.last_verify = last_verify(session.run(host, LAST_VERIFY_COMMAND).stdout)
        except Unreachable as e:
            entry.processes.clear()
            entry.unreachable = e.message
    ray = None
    if launcher == "ray" and nodes[session.head.name].processes.get("main") is ProcessState.RUNNING:
        try:
            members = ray_members(session, runtime, fabric, len(session.hosts), 5)
            by_ip = {m.ip: m for m in members}
            for name, node in fabric.items():
                member = by_ip.get(node.ip)
                nodes[name].ray = RayMembership(member is not None, member.ip if member else None,
                                                member.gpus if member else 0)
            ray = RayStatus(len(members), sum(m.gpus for m in members),
                            tuple(judge_members(members, fabric_ips(session), other_ips(session))))
        except SparkclusterError as e:
            ray = RayStatus(error=e.message)
    if serving is None:  # nothing served: the supervisor may say why (it gave up after failed restarts)
        return ClusterStatus(record, nodes, ray, supervisor=read_view(session))
    # A replica is read over HTTP, outside --limit too: the endpoint's figures are all the replicas' sum.
    addresses = {h.name: h.address for h in session.inventory.every_host}
    placements = [p for p in serving.replicas if p.head in addresses]
    with ThreadPoolExecutor(max_workers=2 + len(placements)) as pool:  # each measures over the same second
        server = pool.submit(server_status, session, serving, not placements)
        seen = pool.submit(of_session, session)  # where `monitor up` runs Prometheus: its last minutes instead
        replicas = tuple(pool.map(lambda p: replica_status(p, addresses[p.head], nodes), placements))
    workers, problems = (router_workers(session, runtime, serving, fabric)
                         if nodes[session.head.name].processes.get("router") is ProcessState.RUNNING else (None, ()))
    endpoint = behind_router(server.result(), replicas)
    if (prometheus := seen.result()) is not None:
        endpoint = replace(endpoint, figures=prometheus.figures, prometheus=prometheus)
    return ClusterStatus(record, nodes, ray, endpoint, replicas=replicas,
                         router_problems=problems, router_workers=workers, supervisor=read_view(session))


def router_workers(session: Session, runtime: RuntimeChoice, serving: Serving,
                   fabric: dict[str, Node]) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """(the router's workers, what is wrong with them against the record), read on the head's loopback, where alone
    the router's admin API answers (router.py): a worker serve did not start would receive clients' prompts and key."""
    expected = {worker_url(fabric, p): f"replica {p.index} on {p.head}" for p in serving.replicas if p.head in fabric}
    unplaced = [p.port for p in serving.replicas if p.head not in fabric]
    try:
        answer = session.run(session.head, workers_command(runtime, session.inventory, session.head, serving.port))
        if not answer.ok:
            return None, (f"the router's workers could not be read on {session.head.name}: "
                          f"{(answer.stderr or answer.stdout).strip()[-300:]}",)
        listed = listed_workers(answer.stdout)
    except Unreachable as e:
        return None, (f"the router's workers could not be read: {e.message}",)
    except SparkclusterError as e:
        return None, (e.message,)
    return listed, tuple(worker_problems(listed, expected, unplaced))


def behind_router(server: ServerStatus, replicas: tuple[ReplicaStatus, ...]) -> ServerStatus:
    """The endpoint's figures as the replicas' own, summed (scrape.summed); one engine's as measured."""
    engines = [r.figures for r in replicas if r.figures is not None]
    return replace(server, figures=summed(engines)) if engines else server


def node_roles(serving: Serving | None, launcher: str, is_head: bool) -> list[str]:
    """The processes a node runs: main (Ray, or its vLLM rank), vllm (the head's beside Ray), router (the head's, in
    front of replicas)."""
    return (["main"] + (["vllm"] if serving and launcher == "ray" and is_head else [])
            + (["router"] if serving and serving.replicas and is_head else []))


def replica_status(placement: Placement, address: str, nodes: dict[str, NodeStatus]) -> ReplicaStatus:
    """A replica's own /health and figures (at its rank 0's `address`, as this machine reaches it) and its nodes
    whose vLLM is not running."""
    url = f"http://{address}:{placement.port}"
    health, _ = http(f"{url}/health")
    down = tuple(n for n in placement.nodes if n in nodes and (
        nodes[n].unreachable or nodes[n].processes.get("main") is not ProcessState.RUNNING))
    measured = endpoint_figures(f"{url}/metrics")[0] if health == 200 else None
    return ReplicaStatus(placement, f"{url}/v1", health, down, measured)


def server_status(session: Session, serving: Serving, measure: bool = True) -> ServerStatus:
    """vLLM's health, its model list (asked with the key a client sends: serving/apikey.py) and, where `measure`
    (one engine, no router in front), its figures."""
    base = f"http://{session.head.address}:{serving.port}"
    health, _ = http(f"{base}/health")
    api_key = client_api_key(session.inventory, session.head)
    code, text = http(f"{base}/v1/models", api_key=api_key)
    measured, metrics_error = endpoint_figures(f"{base}/metrics") if health == 200 and measure else (None, None)
    models_error = "; ".join(unauthorized(f"{base}/v1/models", api_key is not None)) if code == 401 else None
    return ServerStatus(serving.endpoint, serving.model, serving.served_name, health,
                        tuple(served_models(text)) if code == 200 else (), measured, metrics_error, models_error)


def endpoint_figures(url: str, window_s: float = SUMMARY_WINDOW_S) -> tuple[EndpointFigures | None, str | None]:
    """`top`'s endpoint figures over `window_s` (two scrapes): (figures, None) or (None, why there are none)."""
    first = fetch(url)
    if first.scrape is None:
        return None, first.error
    time.sleep(window_s)
    second = fetch(url)
    if second.scrape is None:
        return figures(first.scrape), None
    return figures(second.scrape, first, second.at), None


def logs_command(record: ServeRecord | None, runtime: RuntimeChoice, host: Host, head: Host, lines: int,
                 follow: bool) -> Command:
    """One node's logs: Ray's (or its vLLM rank's), and the head's vLLM beside Ray; followed in parallel with -f."""
    on = runtime.on(host)
    launcher = record.launcher if record else "ray"
    roles = node_roles(record.serving if record else None, launcher, host.name == head.name)
    if record is None or record.serving is None:  # Ray alone (up), or nothing recorded: the head's vLLM log still
        roles += ["vllm"] if host.name == head.name and launcher == "ray" else []
    parts = [on.logs(role, lines, follow).script for role in roles]
    if follow:
        return Command(" & ".join(parts) + "; wait", timeout=60)
    return Command("; ".join(f"echo '== {r} =='; {p}" for r, p in zip(roles, parts)), timeout=60)
