"""Starting, watching and stopping the serving processes on every node: the start commands of Ray and vLLM
(eugr's lines, in the chosen runtime, with each node's own env), the order they start in, whether they still
run, what the head's log says when they do not, and stopping everything this tool starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.parallel import parallel_map
from ..engine.transport import Unreachable
from .launch import CONTAINER, Node, ServeArgs, ray_start_argv, vllm_serve_argv
from .nodes import Cluster, node_env
from .runtime import RuntimeChoice, stop_all_serving

LOG_TAIL_LINES = 15


def ray_commands(cluster: Cluster, runtime: RuntimeChoice, nodes: Mapping[str, Node],
                 recipe_env: Mapping[str, str]) -> dict[str, Command]:
    """node -> the command that starts its Ray (eugr's `ray start`, detached)."""
    commands = {}
    for host in cluster.hosts:
        gpus = host.vars.get("ray_num_gpus")
        argv = ray_start_argv(nodes[host.name], int(gpus) if gpus is not None else None)
        commands[host.name] = runtime.on(host).start_main(argv, node_env(cluster.inventory, host, recipe_env))
    return commands


def vllm_commands(cluster: Cluster, runtime: RuntimeChoice, nodes: Mapping[str, Node], launcher: str,
                  args: ServeArgs) -> dict[str, Command]:
    """node -> the command that starts its vLLM: the head's only with Ray, every node's (rank order) without."""
    nnodes, head = len(cluster.hosts), cluster.head
    if launcher == "ray":
        argv = vllm_serve_argv(args, "ray", nodes[head.name], nnodes)
        return {head.name: runtime.on(head).start_vllm_on_main(argv, node_env(cluster.inventory, head, args.env))}
    return {h.name: runtime.on(h).start_main(vllm_serve_argv(args, "native", nodes[h.name], nnodes),
                                             node_env(cluster.inventory, h, args.env)) for h in cluster.hosts}


def start(cluster: Cluster, commands: Mapping[str, Command], what: str, fix: str) -> None:
    """Runs start commands: the head's first (the others connect to it), then the rest in parallel."""
    def one(host: Host) -> None:
        result = cluster.run(host, commands[host.name])
        if not result.ok:
            raise SparkclusterError(f"starting {what} on {host.name} failed (exit {result.exit_code}): "
                                    f"{result.stderr_tail(3)}", fix)
    hosts = [h for h in cluster.hosts if h.name in commands]
    one(hosts[0])
    if hosts[1:]:
        parallel_map(one, hosts[1:], workers=len(hosts) - 1, on_abort=cluster.close)


def running_current(runtime: RuntimeChoice, host: Host) -> Command:
    """Exits 0 when the node's Ray runs, and in a container of the image just checked: one started from an older
    image is not reused."""
    alive = replace(runtime.on(host).alive("main"), timeout=30)
    if runtime.name != "docker" or not runtime.image_id:
        return alive
    return Command(f"{alive.script} && test \"$(docker inspect -f '{{{{.Image}}}}' {CONTAINER})\" = {runtime.image_id}",
                   timeout=30)


def gone(cluster: Cluster, runtime: RuntimeChoice, launcher: str) -> str | None:
    """Why the server cannot answer any more, or None while its processes run."""
    checks = [(h, "main") for h in cluster.hosts] + ([(cluster.head, "vllm")] if launcher == "ray" else [])
    for host, role in checks:
        try:
            alive = runtime.on(host).alive(role)
            if not cluster.run(host, replace(alive, timeout=30)).ok:
                what = "vLLM" if role == "vllm" or launcher == "native" else "Ray"
                return f"{what} on {host.name} exited"
        except Unreachable as e:
            return f"{host.name} is unreachable ({e.message})"
    return None


def diagnosis(cluster: Cluster, runtime: RuntimeChoice, launcher: str) -> str:
    """The last lines of the head's vLLM log and what they show."""
    role = "vllm" if launcher == "ray" else "main"
    head = cluster.head
    try:
        logs = runtime.on(head).logs(role, 200, False)
        lines = cluster.run(head, replace(logs, timeout=30)).stdout.strip().splitlines()
    except Unreachable as e:
        return f"{head.name} is unreachable: {e.message}"
    hints = []
    waiting = [line for line in lines if "placement group" in line.lower()]
    if waiting:
        hints.append("Ray is waiting for a placement group: a node lacks a GPU in Ray, or joined on an address "
                     "vLLM does not use (check `sparkcluster status`): " + waiting[-1].strip())
    tail = "\n    ".join(lines[-LOG_TAIL_LINES:]) or "(empty)"
    return "; ".join(hints + [f"last lines of the vLLM log on {head.name}:\n    {tail}"])


def stop_everywhere(cluster: Cluster) -> dict[str, str]:
    """node -> what was stopped ("" for nothing) or why it could not be reached."""
    def stop(host: Host) -> tuple[str, str]:
        try:
            # A failed phase may have closed every connection to interrupt its threads: open a new one.
            cluster.transports[host.name].reconnect()
            result = cluster.run(host, replace(stop_all_serving(host), timeout=60))
            return host.name, " ".join(result.stdout.split()) if result.ok else f"failed: {result.stderr_tail(2)}"
        except Unreachable as e:
            return host.name, f"unreachable: {e.message}"
    return dict(parallel_map(stop, cluster.hosts, workers=len(cluster.hosts)))
