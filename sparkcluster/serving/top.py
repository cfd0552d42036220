"""`sparkcluster top`'s wiring: which cluster to watch and what each node serves, read from the head's serve
record (behind a router, each replica and where its own /metrics answers), handed to the observe wing's live view
(what it shows and how it samples live there)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..engine.cliapp import App, Connect, no_check
from ..engine.console import out as console
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.transport import Unreachable
from ..observe.nodeprobe import AliveChecks, NodeSampler
from ..observe.promrange import of_session
from ..observe.replicas import ReplicaTarget
from ..observe.scrape import metrics_url
from ..observe.top import MAX_INTERVAL_S, MIN_INTERVAL_S, Source, url_of, watch
from .launch import RUNTIMES, Launcher
from .record import Serving
from .runtime import RuntimeChoice, cluster_runtime
from .status import node_roles, recorded


def interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"{text} must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S:g} seconds")
    return value


def roles(launcher: Launcher, serving: Serving | None, is_head: bool) -> list[str]:
    """main: Ray (ray launcher) or the vLLM rank (native); vllm: the `vllm serve` beside the head's Ray; router: the
    head's, in front of replicas."""
    return node_roles(serving, launcher, is_head)


def alive_checks(runtime: RuntimeChoice, host: Host, node_roles: list[str]) -> AliveChecks:
    """Each role's shell test on `host`, as its runtime answers it (a container, or a process of the host)."""
    return {role: runtime.on(host).alive(role).script for role in node_roles}


def replica_targets(hosts: Sequence[Host], serving: Serving | None) -> tuple[ReplicaTarget, ...]:
    """Each replica behind the router and where this machine reaches its own /metrics: its rank 0's address at
    the replica's port, as `status` asks its /health. Callers pass every host, those --limit left out too (HTTP
    reaches them, and the endpoint's figures are every replica's); a replica whose first node is not among `hosts`
    is left out."""
    address = {h.name: h.address for h in hosts}
    return tuple(ReplicaTarget(p.index, p.nodes, metrics_url(f"http://{address[p.head]}:{p.port}"))
                 for p in (serving.replicas if serving else ()) if p.head in address)


@contextmanager
def _source(args: argparse.Namespace, connect: Connect) -> Iterator[Source]:
    url = url_of(args.url) if args.url else None  # checked before anything connects
    if url is not None and not args.inventory and not getattr(args, "limit", None):
        yield Source(url, None, "ray", None)
        return
    with connect(args, no_check, require_all=False) as session:
        launcher, serving, note, runtime = _served(session, RuntimeChoice(cluster_runtime(
            session.inventory, getattr(args, "runtime", None)).name))
        serving_url = metrics_url(serving.endpoint) if serving else None
        head = session.head.name

        def checks(host: Host) -> AliveChecks:
            return alive_checks(runtime, host, roles(launcher, serving, host.name == head))

        sampler = NodeSampler(session, checks)
        # --url names one endpoint to watch; otherwise the recorded replicas, each at its own /metrics
        replicas = () if url else replica_targets(session.inventory.every_host, serving)
        # the served endpoint (not a --url's): where `monitor up` runs Prometheus, its range over the last minutes
        ask = (lambda: of_session(session)) if serving_url and not url else None
        source = Source(url or serving_url, sampler, launcher, None if (url or serving_url) else note, replicas, ask)
        try:
            yield source
        finally:
            source.close()
            sampler.close()


def _served(session: Session, chosen: RuntimeChoice) -> tuple[Launcher, Serving | None, str, RuntimeChoice]:
    """(launcher, what is served, a note when nothing is, runtime) from the head's record; `chosen`
    (--runtime, else the inventory's) where none is recorded."""
    try:
        record, runtime = recorded(session, chosen)
    except (Unreachable, SparkclusterError) as e:
        return "ray", None, f"the head's serve record cannot be read: {e.message}", chosen
    if record is None or record.serving is None:
        return (record.launcher if record else "ray"), None, "nothing is served (no `sparkcluster serve` recorded)", runtime
    return record.launcher, record.serving, "", runtime


def cmd_top(args: argparse.Namespace, connect: Connect) -> int:
    with _source(args, connect) as source:
        return watch(source, args.interval, args.once, args.json, console)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    p = app.connecting(commands.add_parser(
        "top", help="live view: per node GPU and memory, Ray and vLLM; the endpoint's /metrics"),
        inventory_positional=False)
    p.add_argument("--url", help="an endpoint's address (http://HOST:PORT[/v1]); alone, no node is contacted")
    p.add_argument("--runtime", choices=RUNTIMES,
                   help="how to look for Ray and vLLM when no serve is recorded (default: the inventory's "
                        "`runtime`, which `bootstrap --runtime` records, else docker)")
    p.add_argument("--interval", type=interval, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--once", action="store_true",
                   help="one sample (two scrapes an interval apart, for the rates), then exit; with --json a document")
    app.wire(p, cmd_top)
