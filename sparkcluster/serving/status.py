"""`status` and `logs`: what runs on each node, read from the nodes themselves and the record on the head."""

from __future__ import annotations

from dataclasses import replace

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.transport import Unreachable
from .membership import judge_members, ray_members
from .nodes import Cluster, read_nodes
from .readiness import http, served_models
from .runtime import RuntimeChoice


def recorded(cluster: Cluster, chosen: RuntimeChoice) -> tuple[dict, RuntimeChoice]:
    """What the last `up`/`serve` recorded on the head, and the runtime it used (the flags' where none)."""
    record = cluster.read_record()
    if not record:
        return record, chosen
    return record, replace(chosen, name=record["runtime"], image=record["image"])


def status(cluster: Cluster, chosen: RuntimeChoice) -> dict:
    """Per node: process state, Ray membership and address, GPUs; the server's health, model, endpoint."""
    record, runtime = recorded(cluster, chosen)
    serving = record.get("serving") or {}
    launcher = record.get("launcher", "ray")
    nodes: dict[str, dict] = {h.name: {} for h in cluster.hosts}
    try:
        fabric = read_nodes(cluster)
    except SparkclusterError as e:
        return {"state": record, "error": e.message, "nodes": nodes}
    for host in cluster.hosts:
        entry = nodes[host.name]
        entry["fabric_ip"] = fabric[host.name].ip
        roles = ["main"] + (["vllm"] if serving and launcher == "ray" and host.name == cluster.head.name else [])
        try:
            for role in roles:
                alive = replace(runtime.on(host).alive(role), timeout=30)
                entry[role] = "running" if cluster.run(host, alive).ok else "stopped"
        except Unreachable as e:
            entry["main"] = f"unreachable: {e.message}"
    ray: dict = {}
    if launcher == "ray" and nodes[cluster.head.name].get("main") == "running":
        try:
            members = ray_members(cluster, runtime, fabric, len(cluster.hosts), 5)
            by_ip = {m.ip: m for m in members}
            for name, node in fabric.items():
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
    return {"state": record, "ray": ray, "server": server, "nodes": nodes}


def logs_command(record: dict, runtime: RuntimeChoice, host: Host, head: Host, lines: int, follow: bool) -> Command:
    """One node's logs: Ray's (or its vLLM rank's), and the head's vLLM beside Ray; followed in parallel with -f."""
    on = runtime.on(host)
    roles = ["main"] + (["vllm"] if host.name == head.name and record.get("launcher", "ray") == "ray" else [])
    parts = [on.logs(role, lines, follow).script for role in roles]
    if follow:
        return Command(" & ".join(parts) + "; wait", timeout=60)
    return Command("; ".join(f"echo '== {r} =='; {p}" for r, p in zip(roles, parts)), timeout=60)
