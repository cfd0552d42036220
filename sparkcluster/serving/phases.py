"""The phases of `up` and `serve`: a Ray cluster on the QSFP addresses and vLLM with TP = N across it,
brought up phase by phase (image, model, Ray, NCCL probe, vLLM, readiness), each timed.

Nothing is left half-started: when a phase fails, whatever this run started is stopped on every node it can
reach before the error is shown. Once up, nothing depends on the CLI: the cluster runs detached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..engine.command import Command
from ..engine.errors import SparkclusterError, UsageError
from ..engine.inventory import Host
from ..engine.modelref import ModelRef
from ..engine.session import Session
from ..nccl.verdict import VerdictStatus
from ..nccl.verify import run_verify
from ..nccl.verifyresult import VerifyResult
from ..recipes.command import flag_words
from ..recipes.load import Recipe, build_fix, draft_models, merged_flags
from ..recipes.types import Mod
from ..staging.chain import StageResult
from ..staging.stager import stage
from .apikey import key_to_env
from .fit import replica_fit
from .image import MissingImage, check_images, sync_image
from .launch import DEFAULT_IMAGE, DEFAULT_VLLM_PORT, Launcher, Node, RuntimeName, ServeArgs
from .layout import Layout, LayoutAsk, Placement
from .lifecycle import diagnosis, gone, ray_commands, running_current, start, stop_everywhere
from .membership import Member, wait_ray
from .mods_nodes import copy_mods, mods_command, run_mods
from .nodes import node_env, read_nodes
from .processes import Process, processes
from .progress import Emit, PhaseStarted, ProbeJudged
from .provenance import launched
from .readiness import Readiness, wait_ready
from .record import ProbeSummary, ServeRecord, Serving, clear_record, endpoint, fabric_ips, read_record, write_record
from .reuse import may_reuse, ray_fingerprint
from .runtime import RuntimeChoice

# A placement group stays reserved a few seconds after its vLLM exits: a new one must wait.
PLACEMENT_GROUP_RELEASE_S = 5
# One node (eugr's solo mode) has no link between nodes to probe: a lone rank's probe saw no connection and failed.
ONE_NODE_PROBE = "one node: vLLM's ranks talk to no other node, so no link between nodes carries its traffic to probe"
T = TypeVar("T")


@dataclass(frozen=True)
class ServeOptions:
    runtime: RuntimeName = "docker"
    launcher: Launcher = "ray"
    image: str = DEFAULT_IMAGE
    ask: LayoutAsk = LayoutAsk()  # replicas, TP and PP as the flags and the recipe ask, any unset
    layout: Layout = Layout()  # what is served: the ask sized on the selected nodes (serving/cli.sized)
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
    caches: bool = True  # the node's compile/JIT caches mounted (docker) or exported (host); --no-cache-dirs
    runtime_flag: RuntimeName | None = None  # --runtime as given; else the cluster's chooses `runtime` (cli.sized)
    launcher_flag: Launcher | None = None  # --launcher as given; else the recipe's rule and the inventory's choose

    def runtime_choice(self) -> RuntimeChoice:
        return RuntimeChoice(self.runtime, self.image, self.docker_args, caches=self.caches)

    def flags_and_env(self) -> tuple[tuple[str, ...], dict[str, str]]:
        """vLLM's flags and env: its secrets (the API key, the Hugging Face token) leave its command line (every user
        of a node reads that) for its environment (stdin). UsageError for a secret flag serve cannot hand over."""
        return key_to_env(merged_flags(self.recipe, self.extra), self.recipe.env)

    def serve_args(self) -> ServeArgs:
        model = self.model or self.recipe.model
        if not model:
            raise UsageError(f"recipe {self.recipe.name!r} names no model", "give one with --model ORG/NAME")
        flags, env = self.flags_and_env()
        return ServeArgs(model=model, tp=self.layout.tp, pp=self.layout.pp,
                         port=self.port or self.recipe.port or DEFAULT_VLLM_PORT,
                         served_name=self.served_name or self.recipe.served_model_name or model, flags=flags, env=env)


@dataclass
class Phases:
    """Seconds per phase, in order; what the benchmark reports."""

    seconds: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # phase -> why it had nothing to do

    def run(self, name: str, fn: Callable[[], T], emit: Emit) -> T:
        emit(PhaseStarted(name))
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
    runtime: RuntimeName
    launcher: Launcher
    nodes: list[Node]
    phases: dict[str, float]
    readiness: Readiness | None = None
    verify: VerifyResult | None = None
    reused_ray: bool = False
    skipped: dict[str, str] = field(default_factory=dict)  # phase -> why it had nothing to do (what was reused)
    api_key: bool = False  # the endpoint wants an API key (never the key itself: this result is --json's output)
    replicas: list[Placement] = field(default_factory=list)  # behind the router at the endpoint; empty: one engine


def up(session: Session, opts: ServeOptions, phases: Phases,
       emit: Emit) -> tuple[RuntimeChoice, dict[str, Node], list[Member], bool]:
    """The Ray cluster (ray launcher). Reused when already up as it must be (the same start commands and comm env,
    the image just checked, every node on its fabric address); otherwise started fresh.
    Returns the runtime (completed by the image check), the nodes, Ray's members and whether it was reused."""
    nodes = read_nodes(session, opts.layout.tp)
    runtime = _checked_image(session, opts, phases, emit)
    commands = ray_commands(session, runtime, nodes, opts.recipe.env)
    fingerprint = ray_fingerprint(session, commands, opts.recipe.mods)
    if may_reuse(_recorded_fingerprint(session), fingerprint, opts.recipe.mods) and all(
            session.run(h, running_current(runtime, h)).ok for h in session.hosts):
        try:
            members = phases.run("ray", lambda: wait_ray(session, runtime, nodes, timeout=10), emit)
            phases.skipped["ray"] = "already up with the same image, start commands and comm env"
            return runtime, nodes, members, True
        except SparkclusterError:
            pass  # not the cluster it must be: start afresh
    stop_everywhere(session)
    try:
        def bring_up() -> list[Member]:
            start(session, commands, "Ray", runtime.start_fix())
            return wait_ray(session, runtime, nodes, opts.up_timeout)
        members = phases.run("ray", bring_up, emit)
    except BaseException:
        stop_everywhere(session)
        raise
    write_record(session, ServeRecord(opts.runtime, "ray", opts.image, tuple(h.name for h in session.hosts),
                                      ray_fingerprint=fingerprint))
    return runtime, nodes, members, False


def _recorded_fingerprint(session: Session) -> str | None:
    try:
        record = read_record(session)
    except SparkclusterError:
        return None  # unreadable: start afresh (and write a good one)
    return record.ray_fingerprint if record else None


def serve(session: Session, opts: ServeOptions, emit: Emit) -> ServeResult:
    args = opts.serve_args()
    api_key = node_env(session.inventory, session.head, args.env).api_key  # what the head's vLLM will want
    phases = Phases()
    reused = False
    try:
        model_ref = hub_model(args)
        if model_ref is not None:
            staged = phases.run("stage", lambda: stage_model(session, model_ref, emit), emit)
            if staged.bytes == 0:
                phases.skipped["stage"] = f"every node holds {model_ref}"
        for draft in draft_models(args.flags):  # a speculative decoder's draft model is loaded offline too
            draft_ref = ModelRef.parse(draft)
            phases.run("stage", lambda: stage_model(session, draft_ref, emit), emit)
        layout = opts.layout
        replica_fit(session, args.model, layout, args.flags)  # before anything starts: a replica holds the model
        if opts.launcher == "ray":
            runtime, nodes, _, reused = up(session, opts, phases, emit)
            if reused:
                stop = runtime.on(session.head).stop_vllm()
                session.run(session.head, replace(stop, timeout=60))
                time.sleep(PLACEMENT_GROUP_RELEASE_S)
        else:
            nodes = read_nodes(session, opts.layout.tp)
            stop_everywhere(session)
            runtime = _checked_image(session, opts, phases, emit)
        verified = None
        if opts.verify and len(session.hosts) == 1:  # the probe's verdict is on traffic between ranks: none here
            phases.skipped["verify"] = ONE_NODE_PROBE
        elif opts.verify:
            verified = phases.run("verify", lambda: probe(session, runtime, opts, emit), emit)
        if opts.recipe.mods:
            phases.run("mods", lambda: apply_mods(session, runtime, opts.recipe.mods), emit)
        placements = layout.behind_router(list(nodes), args.port)

        def ready_at(url: str, router: bool) -> Readiness:
            return wait_ready(url, args.served_name or args.model, opts.ready_timeout,
                              lambda: gone(session, runtime, opts.launcher, router),
                              lambda: diagnosis(session, runtime, opts.launcher, router), api_key)

        def answering(process: Process) -> Readiness:
            """The process answers at each of its URLs (its nodes at once): the readiness of the first."""
            if len(process.answers) == 1:
                return ready_at(next(iter(process.answers.values())), process.router)
            hosts = {h.name: h for h in session.hosts}
            return session.each(lambda h: ready_at(process.answers[h.name], process.router),
                                [hosts[name] for name in process.answers])[0]

        def started(process: Process) -> Readiness:
            """The process started, then answering: timed as one phase, or as its start's and its readiness's."""
            def begin() -> None:
                start(session, process.commands, process.what, runtime.start_fix())

            def both() -> Readiness:
                begin()
                return answering(process)
            if process.one_phase:
                return phases.run(process.ready_phase, both, emit)
            phases.run(process.start_phase, begin, emit)
            return phases.run(process.ready_phase, lambda: answering(process), emit)
        # engines, then the router in front of replicas: the last answers at the endpoint
        ready = [started(p) for p in processes(session, runtime, nodes, layout, placements, opts.launcher, args)][-1]
    except BaseException:
        stop_everywhere(session)
        clear_record(session)
        raise
    served_name = args.served_name or args.model
    result = ServeResult(endpoint(session.head, args.port), args.model, served_name, opts.runtime, opts.launcher,
                         list(nodes.values()), phases.seconds, ready, verified, reused, phases.skipped,
                         api_key is not None, list(placements))
    fingerprint = (ray_fingerprint(session, ray_commands(session, runtime, nodes, opts.recipe.env), opts.recipe.mods)
                   if opts.launcher == "ray" else None)
    # What produced the numbers bench measures later: published figures compare only with their configuration.
    probe_summary = None if verified is None else ProbeSummary(verified.backend, verified.verdict.status,
                                                               verified.verdict.cause)
    write_record(session, ServeRecord(opts.runtime, opts.launcher, opts.image, tuple(h.name for h in session.hosts),
                                      Serving(args.model, served_name, args.port, result.endpoint, args.tp,
                                              opts.recipe.name, tuple(args.flags), probe_summary, args.pp,
                                              tuple(placements), launched(args, opts.launcher, nodes,
                                                                          session.head.name, placements, opts.recipe)),
                                      ray_fingerprint=fingerprint))
    return result


def plan(session: Session, opts: ServeOptions) -> dict[str, Any]:
    """What serve would do, changing nothing (--check): the image copies and every node's command lines."""
    args = opts.serve_args()
    nodes = read_nodes(session, opts.layout.tp)
    runtime = opts.runtime_choice()
    doc: dict[str, Any] = {"runtime": opts.runtime, "launcher": opts.launcher, "model": args.model, "image_copies": []}
    if opts.runtime == "docker":
        head_info, need = with_build_fix(opts, lambda: check_images(session, opts.image))
        runtime = runtime.with_image(head_info)
        doc["image"] = {"name": opts.image, "id": head_info.id}
        doc["image_copies"] = [{"node": n, "over": fabric_ips(session)[n]} for n in need]
    commands: dict[str, list[str]] = {h.name: [] for h in session.hosts}
    if opts.launcher == "ray":
        for name, command in ray_commands(session, runtime, nodes, opts.recipe.env).items():
            commands[name].append(command.display())
    if opts.recipe.mods:
        doc["mods"] = [{"name": m.name, "from": str(m.path), "given": m.given} for m in opts.recipe.mods]
        for host in session.hosts:
            commands[host.name].append(mods_command(runtime, session, host, opts.recipe.mods).display())
    placements = opts.layout.behind_router(list(nodes), args.port)
    if placements:
        doc["layout"] = opts.layout.to_json()
        doc["replicas"] = [{"index": p.index, "nodes": list(p.nodes), "port": p.port} for p in placements]
    for process in processes(session, runtime, nodes, opts.layout, placements, opts.launcher, args):
        for name, command in process.commands.items():
            commands[name].append(command.display())
    doc["commands"] = commands
    return doc


def apply_mods(session: Session, runtime: RuntimeChoice, mods: tuple[Mod, ...]) -> None:
    """The recipe's mods on every node, in vLLM's start directory, before vLLM starts."""
    copy_mods(session, mods)
    run_mods(session, runtime, mods)


def probe(session: Session, runtime: RuntimeChoice, opts: ServeOptions, emit: Emit) -> VerifyResult:
    """The NCCL probe, one rank per node, where vLLM will run. A fallback (socket, or the management network)
    refuses to serve, unless the user allowed it: serving 4-20x slower without knowing is the failure this
    tool exists to prevent."""
    def in_serving_env(host: Host) -> Callable[[list[str]], Command]:
        return lambda argv: runtime.on(host).run_in_env(argv, node_env(session.inventory, host), twin=True)
    result = run_verify(session, min_busbw=opts.min_busbw,
                        in_serving_env={h.name: in_serving_env(h) for h in session.hosts})
    verdict = result.verdict
    emit(ProbeJudged(result.backend, verdict))
    if verdict.status is VerdictStatus.FAIL and not opts.allow_fallback:
        raise SparkclusterError(f"refusing to serve: the NCCL probe found a fallback: {verdict.cause}",
                                f"{verdict.fix} (or serve anyway with --allow-fallback, 4-20x slower)")
    return result


def stage_model(session: Session, model: ModelRef, emit: Emit) -> StageResult:
    """The model on every node that lacks it, as `sparkcluster stage` puts it there, with the same progress."""
    result = stage(session, model, progress=emit)
    if not result.ok:
        failed = [f"{n}: {s.error}" for n, s in result.nodes.items() if s.state != "complete"]
        raise SparkclusterError(f"staging {model} failed: " + "; ".join(failed),
                                f"run `sparkcluster stage {model}` to see each node's state")
    return result


def _checked_image(session: Session, opts: ServeOptions, phases: Phases, emit: Emit) -> RuntimeChoice:
    """The runtime, completed with the head's image after every node holds it (docker); as chosen (host)."""
    runtime = opts.runtime_choice()
    if opts.runtime != "docker":
        return runtime
    synced = with_build_fix(opts, lambda: phases.run("image", lambda: sync_image(session, opts.image, emit), emit))
    if not synced.sent:
        phases.skipped["image"] = f"every node holds {opts.image} ({(synced.head.id or '')[:19]})"
    return runtime.with_image(synced.head)


def with_build_fix(opts: ServeOptions, step: Callable[[], T]) -> T:
    """`step` (an image check or sync), where a head without the image is told the recipe's build command."""
    try:
        return step()
    except MissingImage as e:
        raise SparkclusterError(e.message, build_fix(opts.recipe, opts.image)) from None


def hub_model(args: ServeArgs) -> ModelRef | None:
    """A Hugging Face repo id is staged first, at the revision vLLM is given (`--revision`: a recipe's
    model_revision), so that vLLM finds offline the files it loads; a path inside the container or node is taken as
    it is."""
    if args.model.startswith(("/", ".", "~")):
        return None
    model = ModelRef.parse(args.model)
    revision = flag_words(list(args.flags), "the vLLM flags").get("--revision")
    return replace(model, revision=revision) if isinstance(revision, str) else model
