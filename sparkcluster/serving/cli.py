"""The serving wing's sub-commands, `up`, `serve`, `status`, `logs` and `down`: wiring from parsed flags to the
phases, and their output (progress on stderr, results on stdout, or one JSON document with --json)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

from rich.markup import escape

from ..engine import flags
from ..engine.cliapp import App, Connect, connecting, no_check
from ..engine.console import err as err_console
from ..engine.console import out as console
from ..engine.console import print_error
from ..engine.errors import EXIT_FAILED, EXIT_OK, UsageError
from ..engine.inventory import Inventory
from ..engine.locks import held
from ..engine.report import print_json
from ..engine.session import Session
from ..engine.transport import openssh_argv, ssh_destination
from ..staging.images import held_layers
from . import headroom, recipes_cli, render, top
from .image import check_images, sync_image
from .launch import DEFAULT_IMAGE, RuntimeName
from .layout import Layout, LayoutAsk
from .lifecycle import StopState, purge_caches, stop_everywhere
from .parallel import choose_launcher, size_layout
from .phases import Phases, ServeOptions, hub_model, plan, serve, up
from .progress import Emit, ignore
from .recipes_cli import chosen, load_for
from .record import clear_record
from .runtime import RuntimeChoice, cluster_launcher, cluster_runtime
from .serve_flags import RECIPE_FLAGS, RUNTIME_FLAGS, add_serve_flags, add_supervise_flags
from .status import logs_command, recorded, status
from .supervision import supervise_after_serve, supervisor_stopped

# serve's own flags (after the runtime's), in its help's order; --check (before the last) is no option of a serve
SERVE_FLAGS = ("tp", "pp", "replicas", "model", "recipe", "launcher", *RECIPE_FLAGS, "port", "served_model_name",
               "ready_timeout", "verify", "allow_fallback", "min_busbw", "force", "cache_dirs")


def options(args: argparse.Namespace, layout: Layout | None = None) -> ServeOptions:
    """Every flag checked before anything connects; a recipe's values are the defaults of our options. `layout`:
    what is asked in place of --replicas, --tp and --pp (`bench --layouts` asks for each layout it measures)."""
    ask = layout.asked() if layout else LayoutAsk(getattr(args, "replicas", None), getattr(args, "tp", None),
                                                  getattr(args, "pp", None))
    recipe = load_for(args, getattr(args, "recipe", None), ask.tp, ask.pp)
    tp = chosen(ask.tp, recipe.tp, "tensor_parallel", args)
    pp = chosen(ask.pp, recipe.pp, "pipeline_parallel", args)
    opts = ServeOptions(
        runtime=args.runtime or "docker", launcher=choose_launcher(getattr(args, "launcher", None), recipe,
                                                                   tp * (pp or 1) if tp else None, args.runtime),
        image=args.image or recipe.container or DEFAULT_IMAGE,
        ask=LayoutAsk(chosen(ask.replicas, recipe.replicas, "replicas", args), tp, pp),
        model=getattr(args, "model", None),
        recipe=recipe, port=chosen(getattr(args, "port", None), recipe.port, "port", args),
        served_name=chosen(getattr(args, "served_model_name", None), recipe.served_model_name, "served_model_name", args),
        extra=tuple(getattr(args, "remote", ())),
        up_timeout=args.up_timeout, ready_timeout=getattr(args, "ready_timeout", 1800.0),
        verify=getattr(args, "verify", True), allow_fallback=getattr(args, "allow_fallback", False),
        min_busbw=getattr(args, "min_busbw", None), docker_args=tuple(args.docker_arg or ()),
        caches=getattr(args, "cache_dirs", True), runtime_flag=args.runtime, launcher_flag=getattr(args, "launcher", None),
    )
    # GB10's unified-memory bounds, on the final vLLM flags and docker arguments (exit 2 unless --force)
    for warning in headroom.hold(opts.flags_and_env()[0], opts.docker_args, getattr(args, "force", False)):
        err_console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False)
    return opts


def serve_flags(s: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """serve's flags on `s`, in its help's order: the command's, and the parser the supervisor reads a serve with."""
    add_serve_flags(s, RUNTIME_FLAGS)
    add_serve_flags(s, SERVE_FLAGS[:-1])
    s.add_argument("--check", action="store_true",
                   help="show the image copies and every node's command lines; start nothing")
    add_serve_flags(s, SERVE_FLAGS[-1:])
    add_supervise_flags(s)
    s.epilog = ("extra vLLM flags go after --, replacing the recipe's flags of the same name; override order: "
                "recipe defaults < --tp/--pp/--port/--served-model-name < --set KEY=VALUE < flags after --")
    return s


def served_options(argv: list[str], remote: list[str], inventory: Inventory) -> ServeOptions:
    """The options a serve given `argv` (and `remote`, after --) had on `inventory`, sized as it sized them: how the
    supervisor starts one replica of it again (serving/replica.py)."""
    parser = serve_flags(connecting(argparse.ArgumentParser(prog="sparkcluster serve"), inventory_positional=False))
    args = parser.parse_args(argv)
    args.remote = remote
    if args.limit:
        inventory = inventory.limit([n.strip() for n in args.limit.split(",") if n.strip()])
    return sized(options(args), inventory)


def _emit(args: argparse.Namespace) -> Emit:
    return ignore if args.json else render.progress_printer(err_console)


def _chosen(args: argparse.Namespace, inventory: Inventory) -> RuntimeChoice:
    """The runtime the flags and the inventory choose (a serve that runs follows its own record, read later)."""
    return RuntimeChoice(cluster_runtime(inventory, args.runtime).name, args.image or DEFAULT_IMAGE,
                         tuple(args.docker_arg or ()))


def _on_cluster(opts: ServeOptions, inventory: Inventory) -> ServeOptions:
    """The options with the cluster's runtime (--runtime, else the inventory's) and launcher: --launcher, else the
    recipe's rule, where the inventory's `launcher` stands in for a recipe that names none."""
    runtime = cluster_runtime(inventory, opts.runtime_flag).name
    given = opts.launcher_flag
    if opts.layout.routed:  # each replica is its own engine: vLLM's own launcher, no Ray cluster across replicas
        if given == "ray":
            raise UsageError(f"--launcher ray with {opts.layout.describe()}: one Ray cluster cannot hold several "
                             "engines' placement groups on the same nodes", "leave --launcher out with --replicas "
                             "(each replica runs vLLM's own launcher), or serve one engine with --replicas 1")
        return dataclasses.replace(opts, runtime=runtime, launcher="native")
    nodes = len(inventory.hosts)  # one engine on every node selected (up: Ray on each)
    if given is None and opts.recipe.launcher is None and nodes > 1 and not (runtime == "docker" and opts.recipe.mods):
        given = cluster_launcher(inventory)
    return dataclasses.replace(opts, runtime=runtime, launcher=choose_launcher(given, opts.recipe, nodes, runtime))


def inventory_replicas(inventory: Inventory) -> int | None:
    """The inventory's `replicas` (its vars), what serve runs when neither --replicas nor the recipe says."""
    value = inventory.vars.get("replicas")
    return value if isinstance(value, int) else None  # checked when the inventory loaded


def one_at_a_time(session: Session) -> AbstractContextManager[None]:
    """Two serves (or ups) on one cluster would start, replace and stop each other's Ray and vLLM: the second
    is refused while the first runs. `down` takes no lock: it is how a user stops a serve that went wrong. The
    head's supervisor is stopped first (it would take this serve's restart for a fault and act on it): serve
    starts it again once it answers; up and bench --layouts leave it off."""
    supervisor_stopped(session)
    return serve_lock(session)


def serve_lock(session: Session) -> AbstractContextManager[None]:
    """The cluster's one lock for what starts or replaces its engines (the supervisor's replica restart takes it)."""
    return held(session, "serve", "a serve or up of this cluster",
                "wait for it, or stop it (`sparkcluster down`) and serve again")


def cmd_up(args: argparse.Namespace, connect: Connect) -> int:
    opts = options(args)
    phases = Phases()
    with connect(args, _runtime_set_up(args, starts=True)) as session, one_at_a_time(session):
        opts = _on_cluster(opts, session.inventory)
        _, _, members, reused = up(session, opts, phases, _emit(args))
    if args.json:
        print_json({"reused": reused, "phases": phases.seconds, "members": [dataclasses.asdict(m) for m in members]})
    else:
        console.print(f"Ray cluster {'already ' if reused else ''}up: {len(members)} nodes, "
                      f"{sum(m.gpus for m in members):g} GPUs, on {', '.join(m.ip for m in members)}", highlight=False)
    return EXIT_OK


def sized(opts: ServeOptions, inventory: Inventory, show: bool = False) -> ServeOptions:
    """The layout for the selected nodes (replicas x TP x PP: serving/layout.py), the cluster's runtime and the
    launcher that takes (one node or replicas: no Ray); and what the runtime needs of the inventory (the host
    runtime: python_env), before anything is staged; the runtime said under the inventory's line (`show`). `bench
    --layouts` sizes each layout it serves here too."""
    _runtime_checked(opts.runtime_flag, show, starts=True)(inventory)
    ask = dataclasses.replace(opts.ask, replicas=opts.ask.replicas or inventory_replicas(inventory))
    chosen = _on_cluster(dataclasses.replace(opts, layout=size_layout(ask, inventory, opts.recipe)), inventory)
    chosen = with_model(chosen, inventory)
    if chosen.recipe.mods and chosen.runtime == "docker" and chosen.launcher == "native":
        raise UsageError(f"recipe {chosen.recipe.name} brings mods, which the docker runtime runs only beside Ray "
                         "(the native launcher's containers start vLLM at once)",
                         "serve with --launcher ray, or with --runtime host")
    return chosen


def with_model(opts: ServeOptions, inventory: Inventory) -> ServeOptions:
    """--model, else the recipe's, else the inventory's first `models:` entry (what bootstrap staged): the bundled
    `default` recipe names no model, and `serve --tp 2` on an inventory listing one serves that one."""
    if opts.model or opts.recipe.model:
        return opts
    if not inventory.models:
        raise UsageError(f"recipe {opts.recipe.name!r} names no model, and the inventory lists none under `models:`",
                         "give one with --model ORG/NAME, or list it under `models:` in the inventory (bootstrap "
                         "stages it)")
    return dataclasses.replace(opts, model=inventory.models[0])


def cmd_serve(args: argparse.Namespace, connect: Connect) -> int:
    opts = options(args)
    opts.flags_and_env()  # a secret flag serve cannot hand over fails before the inventory is read

    def check(inventory: Inventory) -> None:
        # a bad model or revision, or no model at all, fails before any connection
        hub_model(sized(opts, inventory, show=not args.json).serve_args())

    with connect(args, check) as session:
        opts = sized(opts, session.inventory)  # checked before connecting
        if args.check:
            doc = plan(session, opts)
            if args.json:
                print_json(doc)
            else:
                render.serve_plan(console, doc)
            return EXIT_OK
        with one_at_a_time(session):
            result = serve(session, opts, _emit(args))
        supervisor = supervise_after_serve(session, args, opts)
    if args.json:
        print_json({**dataclasses.asdict(result), "supervisor": supervisor.to_json()})
    else:
        render.serving(console, result)
        render.supervisor_line(console, supervisor)
    return EXIT_OK  # a supervisor that could not start is a warning with its fix: the serve answers


def _runtime_set_up(args: argparse.Namespace, show: bool = True, starts: bool = False) -> Callable[[Inventory], None]:
    """Before connecting: the cluster's runtime, said under the inventory's line (`show`, unless --json), and, for
    what `starts` an engine (serve, up), every node has what that needs of the inventory (the host runtime: its
    python_env), or the command is bad input (exit 2). status and logs need none: after `bootstrap --runtime host`,
    before a vLLM environment exists, they answer."""
    return _runtime_checked(args.runtime, show and not args.json, starts)


def _runtime_checked(given: RuntimeName | None, show: bool, starts: bool) -> Callable[[Inventory], None]:
    """_runtime_set_up's check, for the runtime `given` (--runtime), else the inventory's."""
    def check(inventory: Inventory) -> None:
        if show:
            err_console.print(cluster_runtime(inventory, given).shown(), highlight=False)
        for host in inventory.hosts if starts else ():
            RuntimeChoice(cluster_runtime(inventory, given).name).check_starts(host)
    return check


def cmd_status(args: argparse.Namespace, connect: Connect) -> int:
    try:
        with connect(args, _runtime_set_up(args), require_all=False) as session:
            state = status(session, _chosen(args, session.inventory))
    except UsageError as e:
        if not args.json:
            raise
        print_json({"error": e.message, "fix": e.fix})  # a script reading --json gets a document, never nothing
        print_error(e.message, e.fix)
        return e.exit_code
    if args.json:
        print_json(state.to_json())
    else:
        render.status_table(console, state)
    return EXIT_OK if state.healthy else EXIT_FAILED


def cmd_logs(args: argparse.Namespace, connect: Connect) -> int:
    def check_node(inventory: Inventory) -> None:
        if args.node and args.node not in {h.name for h in inventory.hosts}:
            raise UsageError(f"no node named {args.node!r}", "choose from: " + ", ".join(h.name for h in inventory.hosts))
        _runtime_set_up(args)(inventory)

    with connect(args, check_node) as session:
        record, runtime = recorded(session, _chosen(args, session.inventory))
        hosts = [h for h in session.hosts if not args.node or h.name == args.node]
        commands = {h.name: logs_command(record, runtime, h, session.head, args.lines, args.follow) for h in hosts}
        if not args.follow:
            for h in hosts:
                result = session.run(h, commands[h.name])
                console.print(f"[bold]== {h.name} ==[/]", highlight=False)
                print(result.stdout, end="")
            return EXIT_OK
    return _follow({h.name: [*openssh_argv(h), ssh_destination(h), commands[h.name].line()] for h in hosts})


def _follow(argvs: dict[str, list[str]]) -> int:
    """Stream every node's logs, each line prefixed with its node, until Ctrl-C."""
    processes = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for name, argv in argvs.items()}

    def pump(name: str, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(f"{name}: {line}" if len(processes) > 1 else line)
            sys.stdout.flush()

    threads = [threading.Thread(target=pump, args=item, daemon=True) for item in processes.items()]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    finally:
        for process in processes.values():
            process.terminate()
    return EXIT_OK


def cmd_down(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args, no_check) as session:
        supervisor_stopped(session, forget=True)  # first: it would serve again what down stops
        outcomes = stop_everywhere(session)
        if outcomes[session.head.name].state is not StopState.UNREACHABLE:
            clear_record(session)
        purged = purge_caches(session, args.image or DEFAULT_IMAGE) if args.purge_caches else {}
    if args.json:
        doc: dict[str, object] = {"stopped": {name: outcome.describe() for name, outcome in outcomes.items()}}
        if args.purge_caches:
            doc["purged_caches"] = {name: p.describe() for name, p in purged.items()}
        print_json(doc)
    else:
        render.stopped(console, outcomes)
        for name, p in purged.items():
            console.print(f"{name}: caches {p.describe()}", highlight=False)
    ok = all(o.state is StopState.STOPPED for o in [*outcomes.values(), *purged.values()])
    return EXIT_OK if ok else EXIT_FAILED


def cmd_image_sync(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args, no_check) as session:
        if args.check:
            head_info, need = check_images(session, args.image)
            held = {h.name: held_layers(session.transport(h), head_info.layers)
                    for h in session.hosts if h.name in need}
            if args.json:
                print_json({"image": args.image, "id": head_info.id, "layers": len(head_info.layers),
                            "nodes": {name: {"layers_held": n} for name, n in held.items()}})
                return EXIT_OK
            console.print(f"{escape(args.image)} on {session.head.name}: {head_info.id} "
                          f"({len(head_info.layers)} layers)", highlight=False)
            for name, n in held.items():
                console.print(f"  {name}: would receive {len(head_info.layers) - n} layer(s), holds {n}",
                              highlight=False)
            if not held:
                console.print("  every node holds it", highlight=False)
            return EXIT_OK
        synced = sync_image(session, args.image, _emit(args))
    if args.json:
        print_json({"image": args.image, "id": synced.head.id,
                    "nodes": {name: {"id": got, "sent_bytes": synced.sent.get(name, 0)}
                              for name, got in synced.ids.items()}})
    else:
        for name, got in synced.ids.items():
            how = (f"received {synced.sent[name] / 1e6:,.1f} MB over the fabric" if name in synced.sent
                   else "already held it")
            console.print(f"{name}: {got} ({how})", highlight=False)
    return EXIT_OK


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    connecting, wire = app.connecting, app.wire

    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        add_serve_flags(p, RUNTIME_FLAGS)
        return p

    u = common(connecting(commands.add_parser("up", help="bring the Ray cluster up on the QSFP addresses")))
    add_serve_flags(u, ("cache_dirs", "force"))
    wire(u, cmd_up)

    wire(serve_flags(connecting(commands.add_parser("serve", help="serve a model with TP = N across the nodes"),
                                inventory_positional=False)), cmd_serve)

    st = common(connecting(commands.add_parser("status", help="per node: processes, Ray membership; vLLM health")))
    wire(st, cmd_status)

    lg = common(connecting(commands.add_parser("logs", help="Ray and vLLM logs of the nodes")))
    lg.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    lg.add_argument("--node", help="only this node")
    lg.add_argument("-n", "--lines", type=flags.lines, default=100, help="lines per log (default 100)")
    wire(lg, cmd_logs)

    dn = common(connecting(commands.add_parser("down", help="stop vLLM and Ray on every node (idempotent)")))
    dn.add_argument("--purge-caches", action="store_true",
                    help="also delete each node's compile/JIT caches (the next serve compiles from scratch)")
    wire(dn, cmd_down)

    top.register(commands, app)

    recipes_cli.register(commands, app)

    img = commands.add_parser("image", help="container images across the nodes")
    img_cmds = img.add_subparsers(dest="image_command", metavar="IMAGE_COMMAND", required=True)
    sync = connecting(img_cmds.add_parser("sync", help="the head's image on every node: only the layers a node "
                                                       "lacks cross the fabric"), inventory_positional=False)
    sync.add_argument("image", nargs="?", type=flags.image, default="vllm-node", help="image (default vllm-node)")
    sync.add_argument("--check", action="store_true", help="show what each node lacks; copy nothing")
    wire(sync, cmd_image_sync)
