"""Replicas behind vLLM's router: each replica's `vllm serve` (vLLM's own multi-node mode inside a replica, on
its own port), and `vllm-router` (the vllm-router package: a Rust load balancer made for vLLM) on the head at
the endpoint's port. Both start as a node's processes through the runtime, like any vLLM (serving/runtime.py);
these are their command lines, as values.

vllm-router against a plain proxy (nginx round robin), measured on loopback in front of two instant OpenAI
servers (benchmarks/router_overhead.py): see the README's "TP or replicas?" for the numbers. The router also
health-checks the replicas, takes one that stops answering out of rotation and retries a request that met it, which
a plain proxy does only in part."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..engine.command import Command
from ..engine.inventory import Host
from ..engine.session import Session
from .launch import Node, ServeArgs, vllm_serve_argv
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
    """`vllm-router` in front of `workers` (base URLs), answering on every address at `port`. It is started once
    the replicas answer, so its start-up check of the workers passes at its first look."""
    return [ROUTER, "--host", "0.0.0.0", "--port", str(port), "--worker-urls", *workers, "--policy", ROUTER_POLICY,
            "--health-check-interval-secs", str(HEALTH_INTERVAL_S), "--health-failure-threshold", str(HEALTH_FAILURES),
            "--worker-startup-check-interval", "1"]


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
            argv = vllm_serve_argv(replica_args, "native", node, len(members))
            commands[name] = runtime.on(hosts[name]).start_main(argv, node_env(session.inventory, hosts[name],
                                                                                 args.env))
    return commands


def router_command(session: Session, runtime: RuntimeChoice, nodes: Mapping[str, Node],
                   placements: Sequence[Placement], port: int) -> dict[str, Command]:
    """head -> the command that starts the router in front of every replica."""
    head: Host = session.head
    argv = router_argv([worker_url(nodes, p) for p in placements], port)
    return {head.name: runtime.on(head).start_router(argv, node_env(session.inventory, head))}
