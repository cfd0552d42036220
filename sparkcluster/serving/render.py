"""How the serving wing's commands look: progress lines on stderr while `up`, `serve` and `image sync` work,
and their results on stdout (the tables of `status`, the lines of `serve --check`, `down`, `image sync`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..staging.chain import BlobDone
from ..staging.images import ImageBytes
from ..staging.render import progress_printer as blob_printer
from .lifecycle import NodeStopped
from .phases import ServeResult
from .progress import PhaseStarted, ProbeJudged, ServeEvent
from .status import ClusterStatus
from .supervision import SupervisorOutcome

PROGRESS_STEPS = 10  # image progress: one line per tenth of the image per node, not one per second


def progress_printer(console: Console) -> Callable[[ServeEvent], None]:
    """Every serving event as a line: a phase starting, the probe's verdict, each blob staged, each tenth of an
    image per node."""
    shown: dict[str, int] = {}
    blobs = blob_printer(console)

    def show(event: ServeEvent) -> None:
        if isinstance(event, PhaseStarted):
            console.print(f"{event.phase} ...", highlight=False)
        elif isinstance(event, ProbeJudged):
            console.print(f"  probe ({event.backend}): {event.verdict.status} {event.verdict.cause}", highlight=False,
                          markup=False)
        elif isinstance(event, BlobDone):
            blobs(event)
        elif isinstance(event, ImageBytes):
            step = event.done * PROGRESS_STEPS // event.total if event.total else 0
            if shown.get(event.node) != step:
                shown[event.node] = step
                console.print(f"  image -> {event.node}: {event.done / 1e6:.0f} / {event.total / 1e6:.0f} MB",
                              highlight=False)
    return show


def serving(console: Console, result: ServeResult) -> None:
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in result.phases.items())
    shape = (f"{len(result.replicas)} replicas behind vLLM's router" if result.replicas
             else f"TP {len(result.nodes)}")
    console.print(f"[bold green]serving[/] {escape(result.served_name)} with {shape} "
                  f"({result.runtime}, {result.launcher}) at [bold]{result.endpoint}[/]", highlight=False)
    for replica in result.replicas:
        console.print(f"  replica {replica.index} on {', '.join(replica.nodes)}, port {replica.port}", highlight=False)
    console.print(f"  {timings}", highlight=False)
    for phase, why in result.skipped.items():
        console.print(f"  skipped {phase}: {escape(why)}", highlight=False)
    key = " -H \"Authorization: Bearer $VLLM_API_KEY\"" if result.api_key else ""  # the variable: never the key
    console.print(f"  try: curl {result.endpoint}/completions -H 'Content-Type: application/json'{key} "
                  f"-d '{{\"model\": \"{result.served_name}\", \"prompt\": \"Hello\", \"max_tokens\": 16}}'",
                  highlight=False, markup=False)


def supervisor_line(console: Console, outcome: SupervisorOutcome) -> None:
    if outcome.state == "watching":
        console.print("  supervisor: watching (a dead, wedged or lost rank is served again; `sparkcluster events`)",
                      highlight=False)
    elif outcome.why:
        style = "yellow" if outcome.state == "not started" else "dim"
        console.print(f"  [{style}]supervisor: {outcome.state}[/]: {escape(outcome.why)}"
                      + (f"; {escape(outcome.fix)}" if outcome.fix else ""), highlight=False)


def serve_plan(console: Console, doc: dict[str, Any]) -> None:
    console.print(f"would serve {escape(doc['model'])} ({doc['runtime']}, {doc['launcher']}); nothing was changed",
                  highlight=False)
    for copy in doc["image_copies"]:
        console.print(f"  copy image {escape(doc['image']['name'])} to {copy['node']} over {copy['over']}",
                      highlight=False)
    for mod in doc.get("mods", ()):
        console.print(f"  mod {mod['name']} from {mod['from']} (the recipe's {mod['given']}), run on every node "
                      "before vLLM", highlight=False, markup=False)
    for node, lines in doc["commands"].items():
        for line in lines:
            console.print(f"  {node}: {line}", highlight=False, markup=False, soft_wrap=True)


def status_table(console: Console, state: ClusterStatus) -> None:
    record = state.record
    if record is None:
        console.print("nothing is served: no `sparkcluster up` or `serve` recorded on the head", highlight=False)
    table = Table("node", "fabric ip", record.runtime if record else "process", "ray", "gpus", "caches")
    for name, node in state.nodes.items():
        main = f"unreachable: {node.unreachable}" if node.unreachable else str(node.processes.get("main", "?"))
        process = main + (f", vLLM {node.processes['vllm']}" if "vllm" in node.processes else "") + (
            f", router {node.processes['router']}" if "router" in node.processes else "")
        ray = node.ray
        table.add_row(name, node.fabric_ip or "?", escape(process),
                      (ray.address or "not a member") if ray else "-", f"{ray.gpus:g}" if ray else "-",
                      "-" if node.cache_bytes is None else f"{node.cache_bytes / 1e6:,.1f} MB")
    console.print(table)
    for name, node in state.nodes.items():  # the last `verify` each node keeps (issue 20)
        if node.last_verify:
            console.print(f"{name}: last verify {escape(node.last_verify)}", highlight=False)
    for problem in state.ray.problems if state.ray else ():
        console.print(f"[bold red]problem:[/] {escape(problem)}", highlight=False)
    server = state.server
    if server and state.replicas:  # the endpoint is the router's: its /health is 503 while a replica is out
        answer = {200: "[green]healthy[/]", 0: "[red]not answering[/]"}.get(
            server.health, f"[yellow]answering, a replica out of rotation (HTTP {server.health})[/]")
        console.print(f"router {answer} {escape(server.served_name)} ({escape(server.model)}) at {server.endpoint}",
                      highlight=False)
        for replica in state.replicas:
            nodes = ",".join(replica.placement.nodes)
            how = "[green]healthy[/]" if replica.healthy else (
                f"[red]down[/]: vLLM not running on {', '.join(replica.down)}" if replica.down
                else f"[red]not answering[/] (HTTP {replica.health or 'none'})")
            console.print(f"  replica {replica.placement.index} on {nodes} at {replica.endpoint}: {how}",
                          highlight=False)
            if replica.figures is not None:  # its own: the router's /metrics is one replica in turn
                console.print(f"    {escape(replica.figures.summary())}", highlight=False)
        if server.prometheus is not None and server.figures is not None:  # the endpoint as a whole, over minutes
            console.print(f"  endpoint {server.prometheus.said()}: {escape(server.figures.summary())}", highlight=False)
        for problem in state.router_problems:  # a stranger among the router's workers, or a replica missing
            console.print(f"[bold red]problem:[/] {escape(problem)}", highlight=False)
    elif server:
        console.print(f"vLLM {'[green]healthy[/]' if server.healthy else '[red]not answering[/]'} "
                      f"{escape(server.served_name)} ({escape(server.model)}) at {server.endpoint}", highlight=False)
        if server.figures is not None:
            said = f"{server.prometheus.said()}: " if server.prometheus else ""  # else one second of /metrics
            console.print(f"  {said}{escape(server.figures.summary())}", highlight=False)
        elif server.metrics_error:
            console.print(f"  no figures: {escape(server.metrics_error)}", highlight=False)
        if server.models_error:
            console.print(f"  no model list: {escape(server.models_error)}", highlight=False)
    view = state.supervisor
    if view is not None and view.installed:
        told = view.state
        running = "running" if view.active else "[yellow]stopped[/] (`sparkcluster supervise on`)"
        said = f", {told.state} since {told.since}" + (f" ({escape(told.reason)})" if told.reason else "") if told else ""
        console.print(f"supervisor {running}{said}", highlight=False)
        for incident in view.incidents:
            console.print(f"  {escape(incident.line())}", highlight=False)


def stopped(console: Console, outcomes: dict[str, NodeStopped]) -> None:
    for name, outcome in outcomes.items():
        what = outcome.describe()
        console.print(f"{name}: {escape(what) if what else 'nothing was running'}", highlight=False)
