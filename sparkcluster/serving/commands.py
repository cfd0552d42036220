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

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engine import flags
from ..engine.errors import EXIT_FAILED, EXIT_OK, UsageError
from ..engine.inventory import Inventory
from ..engine.report import print_json
from ..engine.session import Session
from ..engine.transport import openssh_argv, ssh_destination
from .lifecycle import stop_everywhere
from .nodes import Cluster
from ..staging.images import held_layers
from .image import check_images, sync_image
from .phases import Phases, ServeOptions, check_tp, hub_model, plan, serve, up
from .recipes import load_recipe
from .runtime import RuntimeChoice
from .status import logs_command, recorded, status

# The CLI's way to connect: the inventory its flags select, `check` run on it before anything connects.
Connect = Callable[[argparse.Namespace, Callable[[Inventory], None]], AbstractContextManager[Session]]
console = Console()
err_console = Console(stderr=True)


def options(args: argparse.Namespace) -> ServeOptions:
    """Every flag checked before anything connects."""
    return ServeOptions(
        runtime=args.runtime, launcher=getattr(args, "launcher", "ray"), image=args.image,
        tp=getattr(args, "tp", None), model=getattr(args, "model", None),
        recipe=load_recipe(getattr(args, "recipe", None) or "default"), port=getattr(args, "port", None),
        served_name=getattr(args, "served_model_name", None), extra=tuple(getattr(args, "remote", ())),
        up_timeout=args.up_timeout, ready_timeout=getattr(args, "ready_timeout", 1800.0),
        verify=getattr(args, "verify", True), allow_fallback=getattr(args, "allow_fallback", False),
        min_busbw=getattr(args, "min_busbw", None), docker_args=tuple(args.docker_arg or ()),
    )


def _say(args: argparse.Namespace) -> Callable[[str], None]:
    if args.json:
        return lambda text: None
    return lambda text: err_console.print(text, highlight=False)


def _image_progress(say: Callable[[str], None]) -> Callable[[str, int, int], None]:
    shown: dict[str, int] = {}

    def report(node: str, done: int, total: int) -> None:
        total = max(total, done)  # the saved stream is a little larger than the image's reported size
        step = done * 10 // total if total else 0
        if shown.get(node) != step:  # one line per tenth, not per second
            shown[node] = step
            say(f"  image -> {node}: {done / 1e6:.0f} / {total / 1e6:.0f} MB")
    return report


def _chosen(args: argparse.Namespace) -> RuntimeChoice:
    return RuntimeChoice(args.runtime, args.image, tuple(args.docker_arg or ()))


def _no_check(inventory: Inventory) -> None:
    pass


def cmd_up(args: argparse.Namespace, connect: Connect) -> int:
    opts = options(args)
    say = _say(args)
    phases = Phases()
    with connect(args, _no_check) as session:
        cluster = Cluster(session.inventory, session.transports, session.facts)
        _, _, members, reused = up(cluster, opts, phases, lambda p: say(f"{p} ..."), _image_progress(say))
    doc = {"reused": reused, "phases": phases.seconds,
           "members": [dataclasses.asdict(m) for m in members]}
    if args.json:
        print_json(doc)
    else:
        console.print(f"Ray cluster {'already ' if reused else ''}up: {len(members)} nodes, "
                      f"{sum(m.gpus for m in members):g} GPUs, on {', '.join(m.ip for m in members)}", highlight=False)
    return EXIT_OK


def cmd_serve(args: argparse.Namespace, connect: Connect) -> int:
    opts = options(args)
    hub_model(opts.serve_args().model)  # a bad model or a recipe without one fails before any connection
    say = _say(args)
    with connect(args, lambda inventory: check_tp(opts.tp, inventory)) as session:  # checked before connecting
        cluster = Cluster(session.inventory, session.transports, session.facts)
        opts = dataclasses.replace(opts, tp=check_tp(opts.tp, cluster.inventory))
        if args.check:
            _print_plan(plan(cluster, opts), args.json)
            return EXIT_OK
        result = serve(cluster, opts, progress=lambda p: say(f"{p} ..."), image_progress=_image_progress(say),
                       say=say)
    if args.json:
        print_json(dataclasses.asdict(result))
    else:
        timings = ", ".join(f"{k} {v:.1f} s" for k, v in result.phases.items())
        console.print(f"[bold green]serving[/] {escape(result.served_name)} with TP {len(result.nodes)} "
                      f"({result.runtime}, {result.launcher}) at [bold]{result.endpoint}[/]", highlight=False)
        console.print(f"  {timings}", highlight=False)
        console.print(f"  try: curl {result.endpoint}/completions -H 'Content-Type: application/json' "
                      f"-d '{{\"model\": \"{result.served_name}\", \"prompt\": \"Hello\", \"max_tokens\": 16}}'",
                      highlight=False, markup=False)
    return EXIT_OK


def _print_plan(doc: dict, as_json: bool) -> None:
    if as_json:
        print_json(doc)
        return
    console.print(f"would serve {escape(doc['model'])} ({doc['runtime']}, {doc['launcher']}); nothing was changed",
                  highlight=False)
    for copy in doc["image_copies"]:
        console.print(f"  copy image {escape(doc['image']['name'])} to {copy['node']} over {copy['over']}",
                      highlight=False)
    for node, lines in doc["commands"].items():
        for line in lines:
            console.print(f"  {node}: {line}", highlight=False, markup=False, soft_wrap=True)


def cmd_status(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args, _no_check) as session:
        doc = status(Cluster(session.inventory, session.transports, session.facts), _chosen(args))
    if args.json:
        print_json(doc)
    else:
        _status_table(doc)
    server = doc.get("server") or {}
    processes = [state for node in doc["nodes"].values() for role, state in node.items() if role in ("main", "vllm")]
    healthy = (not doc.get("ray", {}).get("problems") and all(state == "running" for state in processes)
               and (not server or server.get("health") == 200))
    return EXIT_OK if doc.get("state") and healthy else EXIT_FAILED


def _status_table(doc: dict) -> None:
    state = doc.get("state") or {}
    if not state:
        console.print("nothing is served: no `sparkcluster up` or `serve` recorded on the head", highlight=False)
    table = Table("node", "fabric ip", state.get("runtime", "process"), "ray", "gpus")
    for name, node in doc["nodes"].items():
        ray = node.get("ray") or {}
        process = node.get("main", "?") + (f", vLLM {node['vllm']}" if "vllm" in node else "")
        table.add_row(name, node.get("fabric_ip", "?"), escape(process),
                      (ray.get("address") or "not a member") if ray else "-", f"{ray.get('gpus', 0):g}" if ray else "-")
    console.print(table)
    for problem in (doc.get("ray") or {}).get("problems", []):
        console.print(f"[bold red]problem:[/] {escape(problem)}", highlight=False)
    server = doc.get("server") or {}
    if server:
        ok = server["health"] == 200
        console.print(f"vLLM {'[green]healthy[/]' if ok else '[red]not answering[/]'} {escape(server['served_name'])} "
                      f"({escape(server['model'])}) at {server['endpoint']}", highlight=False)


def cmd_logs(args: argparse.Namespace, connect: Connect) -> int:
    def check_node(inventory: Inventory) -> None:
        if args.node and args.node not in {h.name for h in inventory.hosts}:
            raise UsageError(f"no node named {args.node!r}", "choose from: " + ", ".join(h.name for h in inventory.hosts))

    with connect(args, check_node) as session:
        cluster = Cluster(session.inventory, session.transports, session.facts)
        record, runtime = recorded(cluster, _chosen(args))
        hosts = [h for h in cluster.hosts if not args.node or h.name == args.node]
        commands = {h.name: logs_command(record, runtime, h, cluster.head, args.lines, args.follow) for h in hosts}
        if not args.follow:
            for h in hosts:
                result = cluster.run(h, commands[h.name])
                console.print(f"[bold]== {h.name} ==[/]", highlight=False)
                print(result.stdout, end="")
            return EXIT_OK
    return _follow({h.name: [*openssh_argv(h), ssh_destination(h), commands[h.name].line()] for h in hosts})


def _follow(argvs: dict[str, list[str]]) -> int:
    """Stream every node's logs, each line prefixed with its node, until Ctrl-C."""
    processes = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for name, argv in argvs.items()}

    def pump(name: str, process: subprocess.Popen) -> None:
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
    with connect(args, _no_check) as session:
        cluster = Cluster(session.inventory, session.transports, session.facts)
        stopped = stop_everywhere(cluster)
        if not stopped[cluster.head.name].startswith("unreachable"):
            cluster.clear_record()
    failed = {n: s for n, s in stopped.items() if s.startswith(("unreachable", "failed"))}
    if args.json:
        print_json({"stopped": stopped})
    else:
        for name, what in stopped.items():
            console.print(f"{name}: {escape(what) if what else 'nothing was running'}", highlight=False)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_image_sync(args: argparse.Namespace, connect: Connect) -> int:
    say = _say(args)
    with connect(args, _no_check) as session:
        cluster = Cluster(session.inventory, session.transports, session.facts)
        if args.check:
            head_info, need = check_images(cluster, args.image)
            held = {h.name: held_layers(cluster.transports[h.name], head_info.layers)
                    for h in cluster.hosts if h.name in need}
            doc = {"image": args.image, "id": head_info.id, "layers": len(head_info.layers),
                   "nodes": {name: {"layers_held": n} for name, n in held.items()}}
            if args.json:
                print_json(doc)
            else:
                console.print(f"{escape(args.image)} on {cluster.head.name}: {head_info.id} "
                              f"({len(head_info.layers)} layers)", highlight=False)
                for name, n in held.items():
                    console.print(f"  {name}: would receive {len(head_info.layers) - n} layer(s), holds {n}",
                                  highlight=False)
                if not held:
                    console.print("  every node holds it", highlight=False)
            return EXIT_OK
        synced = sync_image(cluster, args.image, _image_progress(say))
    if args.json:
        print_json({"image": args.image, "id": synced.head.id,
                    "nodes": {name: {"id": got, "sent_bytes": synced.sent.get(name, 0)} for name, got in synced.ids.items()}})
    else:
        for name, got in synced.ids.items():
            how = (f"received {synced.sent[name] / 1e6:,.1f} MB over the fabric" if name in synced.sent
                   else "already held it")
            console.print(f"{name}: {got} ({how})", highlight=False)
    return EXIT_OK


def add_parsers(commands, connecting: Callable[..., argparse.ArgumentParser], wire: Callable) -> None:
    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--runtime", choices=("docker", "host"), default="docker",
                       help="docker: the vllm_node container per node (eugr's setup, default); host: processes "
                            "from the inventory's python_env")
        p.add_argument("--image", type=flags.image, default="vllm-node", help="container image (default vllm-node)")
        p.add_argument("--docker-arg", action="append", metavar="ARG",
                       help="an extra `docker run` argument, e.g. --docker-arg=--shm-size=16g (repeatable)")
        p.add_argument("--up-timeout", type=flags.seconds, default=180.0,
                       help="seconds for every node to join Ray (default 180)")
        return p

    u = common(connecting(commands.add_parser("up", help="bring the Ray cluster up on the QSFP addresses")))
    wire(u, cmd_up)

    s = common(connecting(commands.add_parser("serve", help="serve a model with TP = N across the nodes"),
                          inventory_positional=False))
    s.add_argument("--tp", type=flags.count, help="tensor parallelism: the number of nodes (one GPU each)")
    s.add_argument("--model", help="ORG/NAME[@REVISION] (staged on every node first), or a path on the nodes")
    s.add_argument("--recipe", help="a bundled recipe (default, gpt-oss-120b, nemotron-3-super) or a .yml file")
    s.add_argument("--launcher", choices=("ray", "native"), default="ray",
                   help="ray (eugr's setup, default) or native (vLLM's own --nnodes multi-node mode)")
    s.add_argument("--port", type=flags.port, help="API port (default 8000)")
    s.add_argument("--served-model-name", help="the name clients ask for (default: the model)")
    s.add_argument("--ready-timeout", type=flags.seconds, default=1800.0,
                   help="seconds for vLLM to load and answer (default 1800: large models take 10-15 min)")
    s.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip the NCCL probe before vLLM starts")
    s.add_argument("--allow-fallback", action="store_true",
                   help="serve even when the probe finds NCCL off RDMA (socket or management network)")
    s.add_argument("--min-busbw", type=flags.bandwidth, help="bus bandwidth the probe needs, GB/s")
    s.add_argument("--check", action="store_true",
                   help="show the image copies and every node's command lines; start nothing")
    s.epilog = "extra vLLM flags go after --, replacing the recipe's flags of the same name"
    wire(s, cmd_serve)

    st = common(connecting(commands.add_parser("status", help="per node: processes, Ray membership; vLLM health")))
    wire(st, cmd_status)

    lg = common(connecting(commands.add_parser("logs", help="Ray and vLLM logs of the nodes")))
    lg.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    lg.add_argument("--node", help="only this node")
    lg.add_argument("-n", "--lines", type=flags.lines, default=100, help="lines per log (default 100)")
    wire(lg, cmd_logs)

    dn = common(connecting(commands.add_parser("down", help="stop vLLM and Ray on every node (idempotent)")))
    wire(dn, cmd_down)

    img = commands.add_parser("image", help="container images across the nodes")
    img_cmds = img.add_subparsers(dest="image_command", metavar="IMAGE_COMMAND", required=True)
    sync = connecting(img_cmds.add_parser("sync", help="the head's image on every node: only the layers a node "
                                                       "lacks cross the fabric"), inventory_positional=False)
    sync.add_argument("image", nargs="?", type=flags.image, default="vllm-node", help="image (default vllm-node)")
    sync.add_argument("--check", action="store_true", help="show what each node lacks; copy nothing")
    wire(sync, cmd_image_sync)
