"""The phases of `up` and `serve`: a Ray cluster on the QSFP addresses and vLLM with TP = N across it,
brought up phase by phase (image, model, Ray, NCCL probe, vLLM, readiness), each timed.

Nothing is left half-started: when a phase fails, whatever this run started is stopped on every node it can
reach before the error is shown. Once up, nothing depends on the CLI: the cluster runs detached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TypeVar

from ..engine.command import Command
from ..engine.errors import SparkclusterError, UsageError
from ..engine.inventory import Host, Inventory
from ..engine.modelref import ModelRef
from ..nccl.verify import run_verify
from ..staging.stager import stage
from .image import check_images, sync_image
from .launch import DEFAULT_IMAGE, DEFAULT_VLLM_PORT, Node, ServeArgs
from .lifecycle import diagnosis, gone, ray_commands, running_current, start, stop_everywhere, vllm_commands
from .membership import Member, wait_ray
from .nodes import Cluster, node_env, read_nodes
from .readiness import Readiness, wait_ready
from .recipes import Recipe, merged_flags
from .runtime import RuntimeChoice

# A placement group stays reserved a few seconds after its vLLM exits (vllm-cpu.md): a new one must wait.
PLACEMENT_GROUP_RELEASE_S = 5
T = TypeVar("T")


@dataclass(frozen=True)
class ServeOptions:
    runtime: str = "docker"  # docker | host
    launcher: str = "ray"  # ray | native
    image: str = DEFAULT_IMAGE
    tp: int | None = None
    model: str | None = None
    recipe: Recipe = field(default_factory=lambda: Recipe("default"))
    port: int | None = None
    served_name: str | None = None
    extra: tuple[str, ...] = ()
    up_timeout: float = 180.0
    ready_timeout: float = 1800.0  # a 120B model takes 10-15 min to load on a Spark
    verify: bool = True
    allow_fallback: bool = False
    min_busbw: float | None = None
    docker_args: tuple[str, ...] = ()

    def runtime_choice(self) -> RuntimeChoice:
        return RuntimeChoice(self.runtime, self.image, self.docker_args)

    def serve_args(self) -> ServeArgs:
        model = self.model or self.recipe.model
        if not model:
            raise UsageError(f"recipe {self.recipe.name!r} names no model", "give one with --model ORG/NAME")
        return ServeArgs(model=model, tp=self.tp or 0, port=self.port or self.recipe.port or DEFAULT_VLLM_PORT,
                         served_name=self.served_name or self.recipe.served_model_name or model,
                         flags=merged_flags(self.recipe, self.extra), env=dict(self.recipe.env))


def check_tp(tp: int | None, inventory: Inventory) -> int:
    """--tp must equal the GPUs of the nodes it runs on, one per Spark; refused before anything starts."""
    count = len(inventory.hosts)
    if tp is None:
        return count
    if tp < 1:
        raise UsageError(f"--tp {tp}: tensor parallelism needs at least 1 GPU", "give --tp N with N >= 1")
    if tp > count:
        raise UsageError(f"--tp {tp} needs {tp} GPUs, but the selection has {count} node(s) with one GPU each",
                         f"add nodes to the inventory, or serve with --tp {count}")
    if tp < count:
        names = ",".join(h.name for h in inventory.hosts[:tp])
        raise UsageError(f"--tp {tp} on {count} nodes: each Spark holds one GPU, so TP {tp} runs on exactly {tp} nodes",
                         f"choose them with --limit (e.g. --limit {names}) or a group of {tp}")
    return tp


@dataclass
class Phases:
    """Seconds per phase, in order; what the benchmark reports."""

    seconds: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, fn: Callable[[], T], progress: Callable[[str], None]) -> T:
        progress(name)
        start = time.monotonic()
        try:
            return fn()
        finally:
            self.seconds[name] = round(time.monotonic() - start, 3)


@dataclass
class ServeResult:
    endpoint: str
    model: str
    served_name: str
    runtime: str
    launcher: str
    nodes: list[dict]
    phases: dict[str, float]
    readiness: dict | None = None
    verify: dict | None = None
    reused_ray: bool = False


def up(cluster: Cluster, opts: ServeOptions, phases: Phases, progress: Callable[[str], None],
       image_progress: Callable[[str, int, int], None]) -> tuple[RuntimeChoice, dict[str, Node], list[Member], bool]:
    """The Ray cluster (ray launcher). Reused when already up as it must be; otherwise started fresh.
    Returns the runtime (completed by the image check), the nodes, Ray's members and whether it was reused."""
    nodes = read_nodes(cluster)
    runtime = _checked_image(cluster, opts, phases, progress, image_progress)
    if all(cluster.run(h, running_current(runtime, h)).ok for h in cluster.hosts):
        try:
            members = phases.run("ray", lambda: wait_ray(cluster, runtime, nodes, timeout=10), progress)
            return runtime, nodes, members, True
        except SparkclusterError:
            pass  # not the cluster it must be: start afresh
    stop_everywhere(cluster)
    try:
        def bring_up() -> list[Member]:
            start(cluster, ray_commands(cluster, runtime, nodes, opts.recipe.env), "Ray", runtime.start_fix())
            return wait_ray(cluster, runtime, nodes, opts.up_timeout)
        members = phases.run("ray", bring_up, progress)
    except BaseException:
        stop_everywhere(cluster)
        raise
    cluster.write_record({"runtime": opts.runtime, "launcher": "ray", "image": opts.image,
                          "nodes": [h.name for h in cluster.hosts], "serving": None})
    return runtime, nodes, members, False


def serve(cluster: Cluster, opts: ServeOptions, *, progress: Callable[[str], None],
          image_progress: Callable[[str, int, int], None], say: Callable[[str], None]) -> ServeResult:
    args = opts.serve_args()
    phases = Phases()
    reused = False
    try:
        model_ref = hub_model(args.model)
        if model_ref is not None:
            phases.run("stage", lambda: stage_model(cluster, model_ref), progress)
        if opts.launcher == "ray":
            runtime, nodes, _, reused = up(cluster, opts, phases, progress, image_progress)
            if reused:
                stop = runtime.on(cluster.head).stop_vllm()
                cluster.run(cluster.head, replace(stop, timeout=60))
                time.sleep(PLACEMENT_GROUP_RELEASE_S)
        else:
            nodes = read_nodes(cluster)
            stop_everywhere(cluster)
            runtime = _checked_image(cluster, opts, phases, progress, image_progress)
        verdict = None
        if opts.verify:
            verdict = phases.run("verify", lambda: probe(cluster, runtime, opts, say), progress)
        phases.run("launch", lambda: start(cluster, vllm_commands(cluster, runtime, nodes, opts.launcher, args),
                                           "vLLM", runtime.start_fix()), progress)
        base = f"http://{cluster.head.address}:{args.port}"
        ready: Readiness = phases.run(
            "ready", lambda: wait_ready(base, args.served_name or args.model, opts.ready_timeout,
                                        lambda: gone(cluster, runtime, opts.launcher),
                                        lambda: diagnosis(cluster, runtime, opts.launcher)),
            progress)
    except BaseException:
        stop_everywhere(cluster)
        cluster.clear_record()
        raise
    result = ServeResult(cluster.endpoint(args.port), args.model, args.served_name or args.model, opts.runtime,
                         opts.launcher, [asdict(n) for n in nodes.values()], phases.seconds, asdict(ready),
                         verdict, reused)
    cluster.write_record({"runtime": opts.runtime, "launcher": opts.launcher, "image": opts.image,
                          "nodes": [h.name for h in cluster.hosts], "serving": {
                              "model": args.model, "served_name": result.served_name, "port": args.port,
                              "endpoint": result.endpoint, "tp": args.tp,
                              # What produced the numbers bench measures later: published figures compare only
                              # together with their configuration.
                              "recipe": opts.recipe.name, "flags": list(args.flags),
                              "verify": {"backend": verdict["backend"], "status": verdict["verdict"]["status"],
                                         "cause": verdict["verdict"]["cause"]} if verdict else None}})
    return result


def plan(cluster: Cluster, opts: ServeOptions) -> dict:
    """What serve would do, changing nothing (--check): the image copies and every node's command lines."""
    args = opts.serve_args()
    nodes = read_nodes(cluster)
    runtime = opts.runtime_choice()
    doc: dict = {"runtime": opts.runtime, "launcher": opts.launcher, "model": args.model, "image_copies": []}
    if opts.runtime == "docker":
        head_info, need = check_images(cluster, opts.image)
        runtime = runtime.with_image(head_info)
        doc["image"] = {"name": opts.image, "id": head_info.id}
        doc["image_copies"] = [{"node": n, "over": cluster.fabric_ips()[n]} for n in need]
    commands: dict[str, list[str]] = {h.name: [] for h in cluster.hosts}
    if opts.launcher == "ray":
        for name, command in ray_commands(cluster, runtime, nodes, opts.recipe.env).items():
            commands[name].append(command.display())
    for name, command in vllm_commands(cluster, runtime, nodes, opts.launcher, args).items():
        commands[name].append(command.display())
    doc["commands"] = commands
    return doc


def probe(cluster: Cluster, runtime: RuntimeChoice, opts: ServeOptions, say: Callable[[str], None]) -> dict:
    """The NCCL probe, one rank per node, where vLLM will run. A fallback (socket, or the management network)
    refuses to serve, unless the user allowed it: serving 4-20x slower without knowing is the failure this
    tool exists to prevent."""
    def in_serving_env(host: Host) -> Callable[[list[str]], Command]:
        return lambda argv: runtime.on(host).run_in_env(argv, node_env(cluster.inventory, host), twin=True)
    result = run_verify(cluster.inventory, cluster.transports, cluster.facts, min_busbw=opts.min_busbw,
                        in_serving_env={h.name: in_serving_env(h) for h in cluster.hosts})
    verdict = result.verdict
    say(f"  probe ({result.backend}): {verdict.status} {verdict.cause}")
    if verdict.status == "FAIL" and not opts.allow_fallback:
        raise SparkclusterError(f"refusing to serve: the NCCL probe found a fallback: {verdict.cause}",
                                f"{verdict.fix} (or serve anyway with --allow-fallback, 4-20x slower)")
    return {"backend": result.backend, "verdict": asdict(verdict), "carried_by": result.carried_by}


def stage_model(cluster: Cluster, model: ModelRef) -> None:
    """The model on every node that lacks it, as `sparkcluster stage` puts it there."""
    result = stage(cluster.inventory, cluster.transports, cluster.facts, model)
    if not result.ok:
        failed = [f"{n}: {s.error}" for n, s in result.nodes.items() if s.state != "complete"]
        raise SparkclusterError(f"staging {model} failed: " + "; ".join(failed),
                                f"run `sparkcluster stage {model}` to see each node's state")


def _checked_image(cluster: Cluster, opts: ServeOptions, phases: Phases, progress: Callable[[str], None],
                   image_progress: Callable[[str, int, int], None]) -> RuntimeChoice:
    """The runtime, completed with the head's image after every node holds it (docker); as chosen (host)."""
    runtime = opts.runtime_choice()
    if opts.runtime != "docker":
        return runtime
    synced = phases.run("image", lambda: sync_image(cluster, opts.image, image_progress), progress)
    return runtime.with_image(synced.head)


def hub_model(model: str) -> ModelRef | None:
    """A Hugging Face repo id is staged first; a path inside the container or node is taken as it is."""
    if model.startswith(("/", ".", "~")):
        return None
    return ModelRef.parse(model)
