"""`status` and `logs`: what runs on each node, read from the nodes themselves and the record on the head."""

from __future__ import annotations

from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from .membership import judge_members
from .readiness import http, served_models
from .nodes import Cluster
from ..engine.transport import Unreachable


def status(cluster: Cluster) -> dict:
    """Per node: process state, Ray membership and address, GPUs; the server's health, model, endpoint."""
    state = adopt_state(cluster)
    serving = state.get("serving") or {}
    launcher = state.get("launcher", "ray")
    nodes: dict[str, dict] = {h.name: {} for h in cluster.hosts}
    try:
        cluster.read_nodes()
    except SparkclusterError as e:
        return {"state": state, "error": e.message, "nodes": nodes}
    for host in cluster.hosts:
        runtime = cluster.runtime(host)
        entry = nodes[host.name]
        entry["fabric_ip"] = cluster.nodes[host.name].ip
        roles = ["main"] + (["vllm"] if serving and launcher == "ray" and host.name == cluster.head.name else [])
        try:
            for role in roles:
                entry[role] = "running" if cluster.run(host, runtime.alive(role), timeout=30).ok else "stopped"
        except Unreachable as e:
            entry["main"] = f"unreachable: {e.message}"
    ray: dict = {}
    if launcher == "ray" and nodes[cluster.head.name].get("main") == "running":
        try:
            members = cluster.ray_members(len(cluster.hosts), 5)
            by_ip = {m.ip: m for m in members}
            for name, node in cluster.nodes.items():
                member = by_ip.get(node.ip)
                nodes[name]["ray"] = {"member": member is not None, "address": member.ip if member else None,
                                      "gpus": member.gpus if member else 0}
            ray = {"nodes": len(members), "gpus": sum(m.gpus for m in members),
                   "problems": judge_members(members, cluster.fabric_ips(), cluster.other_ips())}
        except SparkclusterError as e:
            ray = {"error": e.message}
    server: dict = {}
    if serving:
        base = f"http://{cluster.head.address}:{serving['port']}"
        health, _ = http(f"{base}/health")
        code, text = http(f"{base}/v1/models")
        server = {"endpoint": serving["endpoint"], "model": serving["model"], "served_name": serving["served_name"],
                  "health": health, "models": served_models(text) if code == 200 else []}
    return {"state": state, "ray": ray, "server": server, "nodes": nodes}


def adopt_state(cluster: Cluster) -> dict:
    """What the last `up`/`serve` recorded on the head; the cluster then speaks to that runtime and image."""
    state = cluster.read_state() or {}
    if state:
        cluster.runtime_name, cluster.image = state["runtime"], state["image"]
    return state


def logs_line(cluster: Cluster, host: Host, lines: int, follow: bool) -> str:
    state = adopt_state(cluster)
    runtime = cluster.runtime(host)
    roles = ["main"] + (["vllm"] if host.name == cluster.head.name and state.get("launcher", "ray") == "ray" else [])
    parts = [runtime.logs(role, lines, follow) + " 2>&1" for role in roles]
    return " & ".join(parts) + "; wait" if follow else "; ".join(f"echo '== {r} =='; {p}" for r, p in zip(roles, parts))
