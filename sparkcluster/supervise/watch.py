"""One round of looking at a served cluster, from the head: for each engine (one across every node, or each replica)
and the router in front of replicas, whether its nodes answer over SSH, whether its processes run (the runtime's own
`alive` commands, as `status` asks), its /health, a one-token completion now and then, and whether tokens are still
counted while requests run (vLLM's `vllm:iteration_tokens_total` count: the wedge /health cannot see). It reads
through serving's and observe/'s readers; it starts and stops nothing."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Inventory
from ..engine.session import Session
from ..engine.transport import Unreachable

TIMED_OUT = -1  # a Result's exit code when the command ran past its timeout (engine/transport.py)
from ..observe.scrape import RUNNING, fetch
from ..serving.readiness import http
from ..serving.record import Serving
from ..serving.runtime import RuntimeChoice
from ..serving.status import node_roles
from .policy import Check, Policy, ProbeResult

ITERATIONS = "vllm:iteration_tokens_total_count"  # one per engine step: advances while tokens are made
ROUTER = "router"


@dataclass(frozen=True)
class Target:
    """What one check is about: its name in incidents, its nodes, where it answers, the roles that must run."""

    name: str
    nodes: tuple[str, ...]
    base_url: str  # http://ADDRESS:PORT
    router: bool = False
    replica: int | None = None  # the placement's index behind the router


def targets(inventory: Inventory, hosts: Sequence[str], serving: Serving) -> list[Target]:
    """The engines of the recorded serve (on `hosts`, the record's), then the router in front of replicas."""
    addresses = {h.name: h.address for h in inventory.every_host}
    head = inventory.head
    if not serving.replicas:
        return [Target("vLLM", tuple(hosts), f"http://{head.address}:{serving.port}")]
    found = [Target(f"replica {p.index}", tuple(p.nodes), f"http://{addresses[p.head]}:{p.port}", replica=p.index)
             for p in serving.replicas if p.head in addresses]
    return [*found, Target(ROUTER, (head.name,), f"http://{head.address}:{serving.port}", router=True)]


@dataclass
class Progress:
    """The last token count seen per target while requests ran, and since when it has not moved."""

    count: dict[str, float] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)  # when requests began running, or the count last moved
    busy: set[str] = field(default_factory=set)  # requests were running at the last reading
    moved: dict[str, bool] = field(default_factory=dict)  # the count changed since the reading before

    def stalled(self, target: str, running: float | None, count: float | None, now: float, stall_s: float) -> bool:
        previous = self.count.get(target)
        if count is not None:
            self.moved[target] = previous is not None and previous != count
            self.count[target] = count
        if not running or count is None:  # idle (or unreadable): a still count means nothing
            self.busy.discard(target)
            return False
        if target not in self.busy or previous != count:  # requests just began, or tokens were counted
            self.busy.add(target)
            self.since[target] = now
            return False
        return now - self.since[target] >= stall_s

    def advancing(self, target: str) -> bool:
        return self.moved.get(target, False)


@dataclass(frozen=True)
class NodeView:
    down: tuple[str, ...]  # nodes that did not answer over SSH
    stopped: Mapping[str, tuple[str, ...]]  # node -> its roles that do not run


def nodes_view(session: Session, runtime: RuntimeChoice, serving: Serving | None, launcher: str) -> NodeView:
    """Every node's reachability and the serving roles it runs, asked at once."""
    def one(host_name: str) -> tuple[str, bool, tuple[str, ...]]:
        host = next(h for h in session.hosts if h.name == host_name)
        roles = node_roles(serving, launcher, host.name == session.head.name)
        try:
            answers = {r: session.run(host, replace(runtime.on(host).alive(r), timeout=20)) for r in roles}
        except (Unreachable, SparkclusterError):
            return host_name, False, ()
        # A check that timed out (a node under load, sshd slow) says nothing: only an answer "not running" counts.
        return host_name, True, tuple(r for r, a in answers.items() if not a.ok and a.exit_code != TIMED_OUT)
    seen = session.each(lambda h: one(h.name))
    return NodeView(tuple(n for n, up, _ in seen if not up), {n: s for n, up, s in seen if up and s})


def unreachable(session: Session) -> tuple[str, ...]:
    """The session's nodes that do not answer over SSH."""
    def down(host_name: str) -> bool:
        try:
            session.run(host_name, Command("true", timeout=20))
        except (Unreachable, SparkclusterError):
            return True
        return False
    return tuple(h.name for h, lost in zip(session.hosts, session.each(lambda h: down(h.name))) if lost)


def probe(base_url: str, model: str, api_key: str | None, timeout_s: float) -> ProbeResult:
    """One completion token, with the endpoint's key, judged by the usage's count: never by the text, which a
    reasoning model may leave empty."""
    status, text = http(f"{base_url}/v1/completions", {"model": model, "prompt": "1", "max_tokens": 1,
                                                       "temperature": 0}, timeout=timeout_s, api_key=api_key)
    if status in (401, 403):
        return ProbeResult.UNAUTHORIZED
    if status in (429, 503):
        return ProbeResult.BUSY
    if status == 0:
        return ProbeResult.TIMED_OUT
    if status != 200:
        return ProbeResult.FAILED
    try:
        tokens = json.loads(text)["usage"]["completion_tokens"]
    except (ValueError, KeyError, TypeError):
        return ProbeResult.FAILED
    return ProbeResult.OK if isinstance(tokens, int) and tokens >= 1 else ProbeResult.FAILED


def check(target: Target, view: NodeView, served_name: str, api_key: str | None, policy: Policy,
          progress: Progress, now: float, with_probe: bool) -> Check:
    """One target as this round sees it. The router's own process is the head's `router` role; an engine's are
    every role of its nodes but the router."""
    down = tuple(n for n in target.nodes if n in view.down)
    stopped = tuple(n for n in target.nodes if n not in down and any(
        (r == "router") == target.router for r in view.stopped.get(n, ())))
    if down or stopped:
        return Check(target.name, down, stopped, health=0)
    health, _ = http(f"{target.base_url}/health", timeout=policy.probe_timeout_s)
    if target.router and health == 503:
        health = 200  # vllm-router answers 503 while a replica is out of rotation: that replica's own check says so
    stalled = False
    if health == 200 and not target.router:
        reading = fetch(f"{target.base_url}/metrics")
        if reading.scrape is not None:
            stalled = progress.stalled(target.name, reading.scrape.first(*RUNNING), reading.scrape.total(ITERATIONS),
                                       now, policy.stall_s)
    result = probe(target.base_url, served_name, api_key, policy.probe_timeout_s) if with_probe and health == 200 \
        else None
    return Check(target.name, health=health, probe=result, stalled=stalled, advancing=progress.advancing(target.name))
