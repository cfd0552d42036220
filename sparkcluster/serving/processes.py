"""The processes a layout runs, in the order they start: its engines (one vLLM across every node, or one per
replica on its own nodes), then the router in front of several. Each is started (lifecycle.start) and waited for
(readiness.wait_ready) the same way, so serve and --check walk a layout's processes rather than branching on its
shape: the router is a process the runtime starts like vLLM, not a special case (shared/DESIGN.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..engine.command import Command
from ..engine.session import Session
from .launch import Launcher, Node, ServeArgs
from .layout import Layout, Placement
from .lifecycle import vllm_commands
from .record import endpoint
from .router import replica_commands, router_command
from .runtime import RuntimeChoice


@dataclass(frozen=True)
class Process:
    """One process of a layout: what a failed start names it, the command that starts it on each of its nodes, the
    URLs (node -> URL) that answer once it serves, and the phases its start and its readiness are timed as (one
    phase for both where they are the same name)."""

    what: str
    commands: Mapping[str, Command]
    answers: Mapping[str, str]
    start_phase: str
    ready_phase: str
    router: bool = False  # the head's router: what `gone` and `diagnosis` watch besides the engines

    @property
    def one_phase(self) -> bool:
        return self.start_phase == self.ready_phase


def processes(session: Session, runtime: RuntimeChoice, nodes: Mapping[str, Node], layout: Layout,
              placements: tuple[Placement, ...], launcher: Launcher, args: ServeArgs) -> tuple[Process, ...]:
    """The layout's processes on `nodes`, in start order: `placements` are its replicas behind the router
    (Layout.behind_router); none, one engine answering at the endpoint itself."""
    base = endpoint(session.head, args.port).removesuffix("/v1")
    if not layout.routed:
        return (Process("vLLM", vllm_commands(session, runtime, nodes, launcher, args), {session.head.name: base},
                        "launch", "ready"),)
    addresses = {h.name: h.address for h in session.hosts}
    engines = Process("vLLM", replica_commands(session, runtime, nodes, placements, args),
                      {p.head: f"http://{addresses[p.head]}:{p.port}" for p in placements}, "launch", "ready")
    router = Process("the router", router_command(session, runtime, nodes, placements, args),
                     {session.head.name: base}, "router", "router", router=True)
    return engines, router
