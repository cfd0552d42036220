"""`up`, `serve`, `status` and `down`: a Ray cluster on the QSFP addresses and vLLM with TP = N across it,
brought up phase by phase (image, model, Ray, NCCL probe, vLLM, readiness), each timed.

Nothing is left half-started: when a phase fails, whatever this run started is stopped on every node it can
reach before the error is shown. Once up, nothing depends on the CLI: the cluster runs detached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..engine.errors import SparkclusterError, UsageError
from ..engine.modelref import ModelRef
from ..engine.inventory import Inventory
from .launch import DEFAULT_IMAGE, DEFAULT_VLLM_PORT, ServeArgs
from .readiness import Readiness, wait_ready
from .recipes import Recipe, merged_flags
from .nodes import Cluster

# A placement group stays reserved a few seconds after its vLLM exits (vllm-cpu.md): a new one must wait.
PLACEMENT_GROUP_RELEASE_S = 5


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

    def run(self, name: str, fn: Callable[[], object], progress: Callable[[str], None]) -> object:
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
       image_progress: Callable[[str, int, int], None]) -> tuple[list, bool]:
    """The Ray cluster (ray launcher). Reused when already up as it must be; otherwise started fresh.
    Returns (members, reused)."""
    cluster.read_nodes()
    if opts.runtime == "docker":
        phases.run("image", lambda: cluster.sync_image(image_progress), progress)
    if all(cluster.run(h, cluster.current(h), timeout=30).ok for h in cluster.hosts):
        try:
            members = phases.run("ray", lambda: cluster.wait_ray(timeout=10), progress)
            return members, True  # type: ignore[return-value]
        except SparkclusterError:
            pass  # not the cluster it must be: start afresh
    cluster.stop_everywhere()
    try:
        def bring_up() -> list:
            cluster.start(cluster.ray_lines(opts.recipe.env), "Ray")
            return cluster.wait_ray(opts.up_timeout)
        members = phases.run("ray", bring_up, progress)
    except BaseException:
        cluster.stop_everywhere()
        raise
    cluster.write_state({"runtime": opts.runtime, "launcher": "ray", "image": opts.image,
                         "nodes": [h.name for h in cluster.hosts], "serving": None})
    return members, False  # type: ignore[return-value]


def serve(cluster: Cluster, opts: ServeOptions, *, progress: Callable[[str], None],
          image_progress: Callable[[str, int, int], None], stage_model: Callable[[ModelRef], None],
          run_probe: Callable[[Cluster], dict]) -> ServeResult:
    args = opts.serve_args()
    phases = Phases()
    reused = False
    try:
        model_ref = hub_model(args.model)
        if model_ref is not None:
            phases.run("stage", lambda: stage_model(model_ref), progress)
        if opts.launcher == "ray":
            _, reused = up(cluster, opts, phases, progress, image_progress)
            if reused:
                cluster.run(cluster.head, cluster.runtime(cluster.head).stop_vllm(), timeout=60)
                time.sleep(PLACEMENT_GROUP_RELEASE_S)
        else:
            cluster.read_nodes()
            cluster.stop_everywhere()
            if opts.runtime == "docker":
                phases.run("image", lambda: cluster.sync_image(image_progress), progress)
        verdict = None
        if opts.verify:
            verdict = phases.run("verify", lambda: run_probe(cluster), progress)
        phases.run("launch", lambda: cluster.start(cluster.vllm_lines(opts.launcher, args), "vLLM"), progress)
        base = f"http://{cluster.head.address}:{args.port}"
        ready: Readiness = phases.run(  # type: ignore[assignment]
            "ready", lambda: wait_ready(base, args.served_name or args.model, opts.ready_timeout,
                                        lambda: cluster.gone(opts.launcher), lambda: cluster.diagnosis(opts.launcher)),
            progress)
    except BaseException:
        cluster.stop_everywhere()
        cluster.clear_state()
        raise
    result = ServeResult(cluster.endpoint(args.port), args.model, args.served_name or args.model, opts.runtime,
                         opts.launcher, [asdict(n) for n in cluster.nodes.values()], phases.seconds, asdict(ready),
                         verdict, reused)  # type: ignore[arg-type]
    cluster.write_state({"runtime": opts.runtime, "launcher": opts.launcher, "image": opts.image,
                         "nodes": [h.name for h in cluster.hosts], "serving": {
                             "model": args.model, "served_name": result.served_name, "port": args.port,
                             "endpoint": result.endpoint, "tp": args.tp}})
    return result


def plan(cluster: Cluster, opts: ServeOptions) -> dict:
    """What serve would do, changing nothing (--check): the image copies and every node's command lines."""
    args = opts.serve_args()
    cluster.read_nodes()
    doc: dict = {"runtime": opts.runtime, "launcher": opts.launcher, "model": args.model, "image_copies": []}
    if opts.runtime == "docker":
        head_info, need = cluster.image_plan()
        doc["image"] = {"name": opts.image, "id": head_info.id}
        doc["image_copies"] = [{"node": n, "over": cluster.fabric_ips()[n]} for n in need]
    commands: dict[str, list[str]] = {h.name: [] for h in cluster.hosts}
    if opts.launcher == "ray":
        for name, line in cluster.ray_lines(opts.recipe.env).items():
            commands[name].append(line)
    for name, line in cluster.vllm_lines(opts.launcher, args).items():
        commands[name].append(line)
    doc["commands"] = commands
    return doc


def hub_model(model: str) -> ModelRef | None:
    """A Hugging Face repo id is staged first; a path inside the container or node is taken as it is."""
    if model.startswith(("/", ".", "~")):
        return None
    return ModelRef.parse(model)
