"""Replicas behind vLLM's router: each replica's `vllm serve` (vLLM's own multi-node mode inside a replica, on
its own port), and `vllm-router` (the vllm-router package: a Rust load balancer made for vLLM) on the head at
the endpoint's port. Both start as a node's processes through the runtime, like any vLLM (serving/runtime.py);
these are their command lines, as values.

vllm-router against a plain proxy (nginx round robin), measured on loopback in front of two instant OpenAI
servers (benchmarks/router_overhead.py): see docs/serve.md, "TP or replicas?", for the numbers. The router also
health-checks the replicas, takes one that stops answering out of rotation and retries a request that met it, which
a plain proxy does only in part.

Neither answers the LAN itself: each listens on its node's loopback behind the key guard (guard.py), so the router's
admin API (/add_worker, /list_workers...) is reached only on the head itself, where `status` reads its workers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from urllib.parse import urlsplit

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host, Inventory
from ..engine.session import Session
from .guard import LOOPBACK, engine_argv, guarded, inner_port
from .launch import Node, ServeArgs
from .layout import Placement
from .nodes import node_env
from .runtime import RuntimeChoice

ROUTER = "vllm-router"
# round_robin: every replica gets the same share of requests, which is what a layout's measurement compares;
# cache_aware (the router's default) keeps a prompt's prefix on one replica, for chats that come back.
ROUTER_POLICY = "round_robin"
HEALTH_INTERVAL_S = 5  # a replica that stops answering is out of rotation after 2 failed checks, ~10 s
HEALTH_FAILURES = 2


def router_argv(workers: Sequence[str], port: int) -> list[str]:
    """`vllm-router` in front of `workers` (base URLs), behind the key guard at `port`: the router itself on the
    head's loopback. It is started once the replicas answer, so its start-up check of the workers passes at its
    first look. No --api-key: vllm-router checks none of its clients with it, and sends it to the workers itself."""
    return guarded([ROUTER, "--host", LOOPBACK, "--port", str(inner_port(port)), "--worker-urls", *workers,
                    "--policy", ROUTER_POLICY, "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
                    "--health-failure-threshold", str(HEALTH_FAILURES), "--worker-startup-check-interval", "1"], port)


def list_workers_url(port: int) -> str:
    """The router's admin list of its workers, on the head's loopback (behind the guard, nowhere else)."""
    return f"http://{LOOPBACK}:{inner_port(port)}/list_workers"


# Read on the head by the serving environment's Python (in either runtime), bounded in time and size.
_READ_URL = ("import sys, urllib.request; "
             "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read(1 << 20).decode())")


def workers_command(runtime: RuntimeChoice, inventory: Inventory, head: Host, port: int) -> Command:
    """The head's command that prints the router's /list_workers (JSON: {"urls": [...]})."""
    command = runtime.on(head).run_in_env(["python3", "-c", _READ_URL, list_workers_url(port)], node_env(inventory, head))
    return replace(command, timeout=30)


def listed_workers(text: str) -> tuple[str, ...]:
    """The worker URLs of /list_workers' answer. Raises SparkclusterError for anything else."""
    try:
        urls = json.loads(text)["urls"]
    except (ValueError, KeyError, TypeError) as e:
        raise SparkclusterError(f"the router's /list_workers answered no list of workers ({text[:200]!r})",
                                "check the router's log: `sparkcluster logs --node HEAD`") from e
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise SparkclusterError(f"the router's /list_workers answered no list of workers ({text[:200]!r})",
                                "check the router's log: `sparkcluster logs --node HEAD`")
    return tuple(urls)


def worker_problems(listed: Sequence[str], expected: Mapping[str, str], unplaced_ports: Sequence[int] = ()) -> list[str]:
    """What is wrong with the router's workers against the record: `expected` maps each replica's worker URL to its
    label ("replica 1 on spark-2"). A listed worker serve did not start gets requests, the key and the prompts of
    clients; a replica that is not listed gets none. `unplaced_ports`: replicas whose head's fabric address is not
    known here (outside --limit), any worker at their port taken for them."""
    def norm(url: str) -> str:
        return url.rstrip("/")
    known = {norm(u) for u in expected}
    problems = [f"the router sends requests to {u[:200]!r}, a worker serve did not start: it receives clients' "
                "prompts and key (one added through the router's admin API, on the head's loopback); "
                "`sparkcluster serve` again, or `down`, drops it"
                for u in listed if norm(u) not in known and urlsplit(u).port not in unplaced_ports]
    listed_norm = {norm(u) for u in listed}
    problems += [f"{label} ({url}) is not among the router's workers: it gets no requests; `sparkcluster serve` "
                 "again restores it" for url, label in expected.items() if norm(url) not in listed_norm]
    return problems


def replica_nodes(nodes: Mapping[str, Node], placement: Placement) -> dict[str, Node]:
    """A replica's nodes ranked inside it: its first node is rank 0, and the others join it, not the cluster's head."""
    head_ip = nodes[placement.head].ip
    return {name: Node(name, rank, nodes[name].ip, head_ip) for rank, name in enumerate(placement.nodes)}


def worker_url(nodes: Mapping[str, Node], placement: Placement) -> str:
    """Where the router reaches a replica: its rank 0's fabric address (the head reaches every node there)."""
    return f"http://{nodes[placement.head].ip}:{placement.port}"


def replica_commands(session: Session, runtime: RuntimeChoice, nodes: Mapping[str, Node],
                     placements: Sequence[Placement], args: ServeArgs) -> dict[str, Command]:
    """node -> the command that starts its rank of its replica's vLLM (vLLM's own launcher: a replica is one
    engine on its nodes, so no Ray cluster spans replicas)."""
    hosts = {h.name: h for h in session.hosts}
    commands = {}
    for placement in placements:
        members = replica_nodes(nodes, placement)
        replica_args = replace(args, port=placement.port)
        for name, node in members.items():
            argv = engine_argv(replica_args, "native", node, len(members))  # rank 0 behind the key guard
            commands[name] = runtime.on(hosts[name]).start_main(argv, node_env(session.inventory, hosts[name],
                                                                                 args.env))
    return commands


def router_command(session: Session, runtime: RuntimeChoice, nodes: Mapping[str, Node],
                   placements: Sequence[Placement], args: ServeArgs) -> dict[str, Command]:
    """head -> the command that starts the router in front of every replica, at `args.port`; its guard gets the
    replicas' env, the key given by flag included (apikey.key_to_env)."""
    head: Host = session.head
    argv = router_argv([worker_url(nodes, p) for p in placements], args.port)
    return {head.name: runtime.on(head).start_router(argv, node_env(session.inventory, head, args.env))}
