"""Ray membership: which nodes joined, on which address, with how many GPUs; and the judgement that the
cluster is up. Stricter than eugr's wait (which only proves the head runs): N nodes, N GPUs, and every node
on its fabric address (F5: a node on its management address makes the placement group hang)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..engine.errors import SparkclusterError
from ..engine.session import Session
from .launch import RAY_PORT, Node
from .nodes import node_env
from .record import fabric_ips, other_ips
from .runtime import RuntimeChoice

# Runs inside the node's serving env (container or venv): waits for the head's GCS port, then until `want`
# nodes are alive or the deadline passes, and prints what Ray reports.
MEMBERS_PY = r"""
import json, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
want, deadline = int(sys.argv[2]), time.time() + float(sys.argv[3])
while True:
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        break
    except OSError:
        if time.time() > deadline:
            print(json.dumps({"error": "the Ray head's port %s is closed" % sys.argv[1]})); sys.exit(0)
        time.sleep(0.5)
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
while True:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) >= want or time.time() > deadline:
        break
    time.sleep(0.25)  # one GCS query; a node that joins is seen within a quarter second
print(json.dumps({"nodes": [{"ip": n["NodeManagerAddress"], "hostname": n.get("NodeManagerHostname", ""),
                             "gpus": n.get("Resources", {}).get("GPU", 0)} for n in nodes]}))
"""


@dataclass(frozen=True)
class Member:
    ip: str
    hostname: str
    gpus: float


def parse_members(stdout: str) -> list[Member]:
    """The probe's last JSON line; an error it reports becomes a SparkclusterError."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            doc = json.loads(line)
            if "error" in doc:
                raise SparkclusterError(doc["error"], "see `sparkcluster logs --node <head>` for why Ray did not start")
            return [Member(n["ip"], n["hostname"], float(n["gpus"])) for n in doc["nodes"]]
    raise SparkclusterError(f"no answer from Ray: {stdout.strip()[-300:]}", "see `sparkcluster logs`")


def judge_members(members: Sequence[Member], fabric_ips: Mapping[str, str], other_ips: Mapping[str, Sequence[str]],
                  gpus_per_node: int = 1) -> list[str]:
    """Problems with the Ray cluster, each naming the node and the fix; empty when it is up as it must be.
    fabric_ips: node -> the QSFP address it must join on; other_ips: node -> its other addresses."""
    problems = []
    by_ip = {m.ip: m for m in members}
    for name, ip in fabric_ips.items():
        if ip in by_ip:
            gpus = by_ip[ip].gpus
            if gpus < gpus_per_node:
                problems.append(f"{name} joined Ray on {ip} with {gpus:g} GPU(s), not {gpus_per_node}: "
                                "check `nvidia-smi` in its container (--gpus all) or set ray_num_gpus in the inventory")
            continue
        wrong = [m.ip for m in members if m.ip in other_ips.get(name, ())]
        if wrong:
            problems.append(f"{name} joined Ray on {wrong[0]}, its management address, not its fabric address {ip}: "
                            "placement groups would wait on it and traffic would leave the QSFP link; fix "
                            "VLLM_HOST_IP and RAY_NODE_IP_ADDRESS in its comm env (re-run `sparkcluster bootstrap`)")
        else:
            problems.append(f"{name} did not join Ray (expected on {ip}); see `sparkcluster logs --node {name}`")
    known = set(fabric_ips.values()) | {ip for ips in other_ips.values() for ip in ips}
    for m in members:
        if m.ip not in known:
            problems.append(f"a node the inventory does not name joined Ray: {m.hostname or '?'} on {m.ip}; "
                            "stop Ray there (`ray stop`) or add it to the inventory")
    return problems


def ray_members(session: Session, runtime: RuntimeChoice, nodes: Mapping[str, Node], want: int,
                timeout: float) -> list[Member]:
    """What Ray reports once `want` nodes joined or `timeout` passed, asked in the head's serving env."""
    head = session.head
    argv = ["python3", "-c", MEMBERS_PY, f"{nodes[head.name].ip}:{RAY_PORT}", str(want), str(timeout)]
    query = runtime.on(head).run_in_env(argv, node_env(session.inventory, head))
    result = session.run(head, replace(query, timeout=timeout + 90))
    if not result.ok:
        raise SparkclusterError(f"asking Ray for its nodes failed on {head.name}: "
                                f"{result.stderr_tail(3) or result.stdout.strip()[-300:]}",
                                f"see `sparkcluster logs --node {head.name}`")
    return parse_members(result.stdout)


def wait_ray(session: Session, runtime: RuntimeChoice, nodes: Mapping[str, Node], timeout: float) -> list[Member]:
    """Ray's members once every node joined (or the deadline passed), judged: an error names each problem."""
    members = ray_members(session, runtime, nodes, len(session.hosts), timeout)
    problems = judge_members(members, fabric_ips(session), other_ips(session))
    if problems:
        raise SparkclusterError("the Ray cluster is not up as it must be:\n  " + "\n  ".join(problems),
                                "fix the named nodes and run the command again (nothing was left running)")
    return members
