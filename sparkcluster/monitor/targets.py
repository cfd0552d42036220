"""What the cluster's Prometheus scrapes, as one value: each node's exporter, each engine or replica (its own
/metrics, where its key guard answers it without the key), the router's own metrics and the supervisor's files,
built from the inventory and the head's serve record (serving/record.py). Pure: tests build it from data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..engine.inventory import Host
from ..serving.record import ServeRecord
from .exporter import DEFAULT_PORT as EXPORTER_PORT

ROUTER_METRICS = "127.0.0.1:29000"  # vllm-router's own Prometheus listener: the head's loopback (its default)


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port as Prometheus reaches it
    labels: tuple[tuple[str, str], ...]
    path: str = "/metrics"

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")


@dataclass(frozen=True)
class Targets:
    nodes: tuple[Target, ...]
    engines: tuple[Target, ...] = ()
    router: Target | None = None
    supervisor: Target | None = None
    served: str | None = None  # the model served, None: nothing served (nodes only)

    def all(self) -> tuple[Target, ...]:
        return (*self.nodes, *self.engines, *((self.router,) if self.router else ()),
                *((self.supervisor,) if self.supervisor else ()))


def targets_of(hosts: Sequence[Host], head: Host, record: ServeRecord | None, on_head: bool,
               exporter_port: int = EXPORTER_PORT, addresses: Mapping[str, str] | None = None) -> Targets:
    """`on_head`: Prometheus runs on the head (it then reaches the router's loopback listener); else on this
    machine. Each node is reached at `addresses[name]` (its inventory address as ssh resolves it: an ssh_config
    alias's HostName), else its inventory address."""
    by_name = {h.name: h for h in hosts}
    known = addresses or {}

    def _address(host: Host, port: int) -> str:
        name = known.get(host.name, host.address)
        return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"

    nodes = tuple(Target("sparkcluster-node", _address(h, exporter_port), (("node", h.name),)) for h in hosts)
    supervisor = Target("sparkcluster-supervisor", _address(head, exporter_port), (("node", head.name),),
                        "/supervisor")
    serving = record.serving if record is not None else None
    if serving is None:
        return Targets(nodes, supervisor=supervisor)
    model = serving.served_name or serving.model
    if serving.replicas:
        engines = tuple(Target("vllm", _address(by_name[p.head], p.port),
                               (("node", p.head), ("replica", f"replica {p.index}"), ("model", model)))
                        for p in serving.replicas if p.head in by_name)
        router = Target("vllm-router", ROUTER_METRICS if on_head else "", (("node", head.name), ("model", model)))
        return Targets(nodes, engines, router if on_head else None, supervisor, model)
    engine = Target("vllm", _address(head, serving.port), (("node", head.name), ("replica", "vLLM"), ("model", model)))
    return Targets(nodes, (engine,), None, supervisor, model)
