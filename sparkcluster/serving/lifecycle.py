"""Starting, watching and stopping the serving processes on every node: the start commands of Ray and vLLM
(eugr's lines, in the chosen runtime, with each node's own env), the order they start in, whether they still
run, what the head's log says when they do not, and stopping everything this tool starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.events import Failure
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.transport import Unreachable
from .caches import NODE_CACHE_DIR, parse_size, purge_command
from .guard import engine_argv
from .launch import CONTAINER, Launcher, Node, ServeArgs, ray_start_argv
from .nodes import node_env
from .readiness import Diagnosis
from .rootcause import LogRead, root_cause
from .runtime import RuntimeChoice, stop_all_serving

LOG_TAIL_LINES = 15  # shown where the logs name no error
DIAGNOSIS_LINES = 1000  # a failed start logs a few hundred lines: its first exception is among the last thousand


def ray_commands(session: Session, runtime: RuntimeChoice, nodes: Mapping[str, Node],
                 recipe_env: Mapping[str, str]) -> dict[str, Command]:
    """node -> the command that starts its Ray (eugr's `ray start`, detached)."""
    commands = {}
    for host in session.hosts:
        gpus = host.vars.get("ray_num_gpus")
        argv = ray_start_argv(nodes[host.name], gpus)  # an int: checked when the inventory loaded
        commands[host.name] = runtime.on(host).start_main(argv, node_env(session.inventory, host, recipe_env))
    return commands


def vllm_commands(session: Session, runtime: RuntimeChoice, nodes: Mapping[str, Node], launcher: Launcher,
                  args: ServeArgs) -> dict[str, Command]:
    """node -> the command that starts its vLLM: the head's only with Ray, every node's (rank order) without."""
    nnodes, head = len(session.hosts), session.head
    if launcher == "ray":
        argv = engine_argv(args, "ray", nodes[head.name], nnodes)  # behind the key guard (guard.py)
        return {head.name: runtime.on(head).start_vllm_on_main(argv, node_env(session.inventory, head, args.env))}
    return {h.name: runtime.on(h).start_main(engine_argv(args, "native", nodes[h.name], nnodes),
                                             node_env(session.inventory, h, args.env)) for h in session.hosts}


def start(session: Session, commands: Mapping[str, Command], what: str, fix: str) -> None:
    """Runs start commands: the head's first (the others connect to it), then the rest in parallel."""
    def one(host: Host) -> None:
        result = session.run(host, commands[host.name])
        if not result.ok:
            raise SparkclusterError(f"starting {what} on {host.name} failed (exit {result.exit_code}): "
                                    f"{result.stderr_tail(3)}", fix)
    hosts = [h for h in session.hosts if h.name in commands]
    one(hosts[0])
    if hosts[1:]:
        session.each(one, hosts[1:])


def running_current(runtime: RuntimeChoice, host: Host) -> Command:
    """Exits 0 when the node's Ray runs, and in a container of the image just checked: one started from an older
    image is not reused."""
    alive = replace(runtime.on(host).alive("main"), timeout=30)
    if runtime.name != "docker" or not runtime.image_id:
        return alive
    return Command(f"{alive.script} && test \"$(docker inspect -f '{{{{.Image}}}}' {CONTAINER})\" = {runtime.image_id}",
                   timeout=30)


def gone(session: Session, runtime: RuntimeChoice, launcher: Launcher, router: bool = False) -> str | None:
    """Why the server cannot answer any more, or None while its processes run (`router`: the head's router too)."""
    checks = ([(h, "main") for h in session.hosts] + ([(session.head, "vllm")] if launcher == "ray" else [])
              + ([(session.head, "router")] if router else []))
    for host, role in checks:
        try:
            alive = runtime.on(host).alive(role)
            if not session.run(host, replace(alive, timeout=30)).ok:
                what = {"router": "the router", "vllm": "vLLM"}.get(role, "vLLM" if launcher == "native" else "Ray")
                return f"{what} on {host.name} exited"
        except Unreachable as e:
            return f"{host.name} is unreachable ({e.message})"
    return None


def diagnosis(session: Session, runtime: RuntimeChoice, launcher: Launcher, router: bool = False) -> Diagnosis:
    """vLLM's first error in the logs of this launch (the head's vLLM beside Ray, each node's Ray or vLLM rank),
    what else they show, and where to read them whole."""
    def read(host: Host) -> list[LogRead | str]:
        head = host.name == session.head.name
        roles = (["router"] if router and head else []) + (["vllm"] if launcher == "ray" and head else []) + ["main"]
        reads: list[LogRead | str] = []
        for role in roles:
            try:
                logs = runtime.on(host).logs(role, DIAGNOSIS_LINES, False)
                lines = session.run(host, replace(logs, timeout=30)).stdout.splitlines()
            except Unreachable as e:
                reads.append(f"{host.name} is unreachable: {e.message}")
                continue
            log = {"router": "router log"}.get(role, "Ray log" if role == "main" and launcher == "ray" else "vLLM log")
            reads.append(LogRead(host.name, log, tuple(lines)))
        return reads
    found = [item for items in session.each(read) for item in items]
    logs = [item for item in found if isinstance(item, LogRead)]
    hints = [item for item in found if isinstance(item, str)]
    head_vllm = next((log.lines for log in logs if log.log == "vLLM log"), ())
    waiting = [line for line in head_vllm if "placement group" in line.lower()]
    if waiting:
        hints.append("Ray is waiting for a placement group: a node lacks a GPU in Ray, or joined on an address "
                     "vLLM does not use (check `sparkcluster status`): " + waiting[-1].strip())
    cause = root_cause(logs)
    if cause is None:
        tail = "\n    ".join(head_vllm[-LOG_TAIL_LINES:]) or "(empty)"
        hints.append(f"last lines of the vLLM log on {session.head.name}:\n    {tail}")
    hints.append(whole_log(runtime, cause.node if cause else session.head.name))
    return Diagnosis(cause.describe() if cause else "", "; ".join(hints))


def whole_log(runtime: RuntimeChoice, node: str) -> str:
    """Where the rest of a failed start's log is: on the node until the next serve, the host runtime's files and
    what was kept of a container once the failed serve stopped it (keptlog.py)."""
    if runtime.name == "host":
        return f"the whole log: `sparkcluster logs --runtime host --node {node} -n {DIAGNOSIS_LINES}`"
    return (f"the whole log, kept on the node after serve stopped the container: `sparkcluster logs --node {node} "
            f"-n {DIAGNOSIS_LINES}`")


class StopState(StrEnum):
    STOPPED = "stopped"  # whatever ran is stopped (possibly nothing)
    UNREACHABLE = "unreachable"
    FAILED = "failed"


@dataclass(frozen=True)
class NodeStopped:
    """One node's outcome of a stop: what was stopped ("" for nothing), or why it could not be."""

    state: StopState
    stopped: str = ""
    failure: Failure | None = None

    def describe(self) -> str:
        return self.stopped if self.failure is None else f"{self.state}: {self.failure.message}"


def stop_everywhere(session: Session) -> dict[str, NodeStopped]:
    """node -> what was stopped, or why it could not be."""
    def stop(host: Host) -> tuple[str, NodeStopped]:
        try:
            # A failed phase may have closed every connection to interrupt its threads: open a new one.
            session.transport(host).reconnect()
            command = replace(stop_all_serving(host), timeout=60)
            result = session.run(host, command)
        except Unreachable as e:
            return host.name, NodeStopped(StopState.UNREACHABLE, failure=Failure(e.message, e.fix))
        if not result.ok:
            return host.name, NodeStopped(StopState.FAILED, failure=Failure(
                result.stderr_tail(2), "run `sparkcluster down` again, or stop the processes by hand",
                command.display(), result.exit_code, result.stderr_tail()))
        return host.name, NodeStopped(StopState.STOPPED, " ".join(result.stdout.split()))
    return dict(session.each(stop))


def purge_caches(session: Session, image: str) -> dict[str, NodeStopped]:
    """node -> how much compile/JIT cache was deleted (`down --purge-caches`), or why it could not be. `image`
    removes what the root container wrote, where the login user may not."""
    def purge(host: Host) -> tuple[str, NodeStopped]:
        command = purge_command(image)
        try:
            result = session.run(host, command)
        except Unreachable as e:
            return host.name, NodeStopped(StopState.UNREACHABLE, failure=Failure(e.message, e.fix))
        if not result.ok:
            return host.name, NodeStopped(StopState.FAILED, failure=Failure(
                f"could not delete {NODE_CACHE_DIR}: {result.stderr_tail(2)}",
                f"files written by a root container need root: `sudo rm -rf {NODE_CACHE_DIR}` on {host.name}",
                command.display(), result.exit_code, result.stderr_tail()))
        size = parse_size(result.stdout)
        return host.name, NodeStopped(StopState.STOPPED, "purged" if size is None else f"purged {size / 1e6:,.1f} MB")
    return dict(session.each(purge))
