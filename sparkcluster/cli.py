"""The `sparkcluster` command line: commands and flags only, wired to the modules that do the work."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
import dataclasses
import getpass
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from . import __version__
from .engine.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, SparkclusterError, UsageError
from .engine.events import RunFinished
from .engine.facts import gather_all
from .engine.inventory import Inventory, find_inventory, load_inventory, record_last_used
from .engine.report import facts_table, make_reporter
from .engine.runner import DEFAULT_FORKS, Runner
from .engine.transport import Transport, Unreachable
from .serving import commands as serve_cli
from .engine.modelref import ModelRef
from .staging.chain import stage, stage_status
from .nccl.verify import run_verify
from .nccl import report as nccl_report
from . import stepcatalog
from .engine.playbook import Playbook
from .staging import render as stage_render
from .sim import render as sim_render
from .sim.cluster import DEFAULT_DRIVER, DEFAULT_LAN_RATE, DEFAULT_NAME, DEFAULT_USER, SimCluster, UpOptions

console = Console()
err_console = Console(stderr=True)


def _print_json(doc: object) -> None:
    print(json.dumps(doc, indent=2))


# ---- inventory, transports ------------------------------------------------------------------------
def _inventory(args: argparse.Namespace) -> Inventory:
    positional = getattr(args, "inventory_arg", None)
    path, reason = find_inventory(positional or args.inventory)
    reason = "as given" if positional else reason
    if not getattr(args, "json", False):
        err_console.print(f"inventory: {path} ({reason})", highlight=False)
    inventory = load_inventory(path)
    if args.limit:
        inventory = inventory.limit([n.strip() for n in args.limit.split(",") if n.strip()])
    return inventory


def _transports(inventory: Inventory, args: argparse.Namespace) -> dict[str, Transport]:
    # Asked once, fed to sudo on stdin; never in argv, logs or --json.
    password = getpass.getpass("BECOME (sudo) password: ") if getattr(args, "ask_become_pass", False) else None
    return {h.name: Transport(h, trust_new_host_keys=args.trust_new_host_keys, sudo_password=password)
            for h in inventory.hosts}


def _connected(args: argparse.Namespace, check: Callable[[Inventory], None] = lambda inventory: None
               ) -> tuple[Inventory, dict[str, Transport], dict]:
    """Inventory, transports and the facts of every node; an unreachable node is an error naming it.
    `check` sees the inventory before anything connects."""
    inventory = _inventory(args)
    check(inventory)
    transports = _transports(inventory, args)
    gathered = gather_all(transports, args.forks)
    down = [f"{n}: {v.message}" for n, v in gathered.items() if isinstance(v, Unreachable)]
    if down:
        for transport in transports.values():
            transport.close()
        raise SparkclusterError("unreachable: " + "; ".join(down), "power the nodes on, or --limit to the others")
    return inventory, transports, gathered


# ---- facts, run -----------------------------------------------------------------------------------
def cmd_facts(args: argparse.Namespace) -> int:
    inventory = _inventory(args)
    transports = _transports(inventory, args)
    gathered = gather_all(transports, args.forks)
    for transport in transports.values():
        transport.close()
    if args.json:
        _print_json({name: ({"unreachable": v.message, "fix": v.fix} if isinstance(v, Unreachable) else v.to_json())
                     for name, v in ((h.name, gathered[h.name]) for h in inventory.hosts)})
    else:
        for h in inventory.hosts:
            value = gathered[h.name]
            if isinstance(value, Unreachable):
                console.print(f"[bold magenta]unreachable[/] {h.name} ({h.address}): {escape(value.message)}\n"
                              f"  fix: {escape(value.fix)}", highlight=False)
            else:
                facts_table(console, h.name, h.address, value)
    return EXIT_FAILED if any(isinstance(v, Unreachable) for v in gathered.values()) else EXIT_OK


def cmd_stage(args: argparse.Namespace) -> int:
    model = ModelRef.parse(args.model)  # bad input fails before any connection
    inventory = _inventory(args)
    transports = _transports(inventory, args)
    gathered = gather_all(transports, args.forks)
    down = {n: v for n, v in gathered.items() if isinstance(v, Unreachable)}
    for name, error in down.items():
        err_console.print(f"[bold magenta]unreachable[/] {name}: {escape(error.message)}\n  fix: {escape(error.fix)}",
                          highlight=False)
    if down:
        return EXIT_FAILED
    facts = {n: v for n, v in gathered.items() if not isinstance(v, Unreachable)}
    try:
        if args.status:
            statuses = stage_status(inventory, transports, facts, model, args.verify)
            if args.json:
                _print_json(statuses)
            else:
                stage_render.status_table(console, str(model), statuses)
            return EXIT_OK if all(s["state"] == "complete" for s in statuses["nodes"].values()) else EXIT_FAILED
        progress = (lambda event: None) if args.json else stage_render.progress_printer(err_console)
        result = stage(inventory, transports, facts, model, source=args.source, verify=args.verify,
                       streams=args.streams, over_lan=args.over_lan, progress=progress)
    finally:
        for transport in transports.values():
            transport.close()
    if args.json:
        _print_json(dataclasses.asdict(result))
    else:
        stage_render.result_table(console, result)
    return EXIT_OK if result.ok else EXIT_FAILED


def cmd_verify(args: argparse.Namespace) -> int:
    inventory = _inventory(args)
    transports = _transports(inventory, args)
    try:
        gathered = gather_all(transports, args.forks)
        down = [f"{n}: {v.message}" for n, v in gathered.items() if isinstance(v, Unreachable)]
        if down:
            raise SparkclusterError("unreachable: " + "; ".join(down), "power the nodes on, or --limit to the others")
        result = run_verify(inventory, transports, gathered, backend=args.backend, sizes=args.sizes,
                            min_busbw=args.min_busbw)
    finally:
        for transport in transports.values():
            transport.close()
    if args.json:
        _print_json({"backend": result.backend, "verdict": dataclasses.asdict(result.verdict),
                     "rows": [dataclasses.asdict(r) for r in result.rows], "carried_by": result.carried_by})
    else:
        nccl_report.render_verify(console, result)
    return EXIT_FAILED if result.verdict.status == "FAIL" else EXIT_OK


def cmd_nccl_report(args: argparse.Namespace) -> int:
    code, text = nccl_report.report(args.logfiles, json_output=args.json, min_busbw=args.min_busbw)
    print(text)
    return code


def _extra_vars(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"-e {pair!r} is not KEY=VALUE", "e.g. -e min_driver=590.44")
        out[key] = value
    return out


def run_playbook(playbook: Playbook, inventory: Inventory, args: argparse.Namespace,
                 extra_vars: dict[str, object] | None = None) -> RunFinished:
    reporter = make_reporter(console, json_output=args.json, show_diff=args.diff, out=sys.stdout)
    runner = Runner(inventory, playbook, reporter, check=args.check, forks=args.forks,
                    transports=_transports(inventory, args), extra_vars=extra_vars)
    return runner.run()


def cmd_run(args: argparse.Namespace) -> int:
    playbook = stepcatalog.load(args.playbook)  # all input is validated before any connection
    extra = _extra_vars(args.extra_vars or [])
    inventory = _inventory(args)
    return run_playbook(playbook, inventory, args, extra).exit_code


def cmd_bootstrap(args: argparse.Namespace) -> int:
    playbook = stepcatalog.load_bundled("bootstrap")
    extra: dict[str, object] = {}
    if args.min_driver:
        extra["min_driver"] = args.min_driver
    if args.driver_policy:
        extra["driver_policy"] = args.driver_policy
    if args.allow_other_gpu:
        extra["allow_other_gpu"] = True
    if args.runtime:
        extra["runtime"] = args.runtime
    inventory = _inventory(args)
    result = run_playbook(playbook, inventory, args, extra)
    if result.exit_code == 0 and not args.check and not args.limit:
        record_last_used(Path(inventory.path))  # what `serve` falls back to when no inventory is named
    return result.exit_code


# ---- sim ------------------------------------------------------------------------------------------
def cmd_sim_up(args: argparse.Namespace) -> int:
    opts = UpOptions(
        count=args.count, name=args.name, drivers=tuple(args.driver or [DEFAULT_DRIVER]),
        port0_hosts=frozenset(args.port0 or []), docker=args.docker, lan_rate=args.lan_rate,
        user=args.user, ssh_mesh=args.ssh_mesh, vllm_env=str(Path(args.vllm_env).resolve()) if args.vllm_env else None,
    )
    with err_console.status(f"booting {args.count} simulated Spark(s)…", spinner="dots") if not args.json else nullcontext():
        cluster = SimCluster.up(opts)
    if args.json:
        _print_json(cluster.describe())
    else:
        sim_render.cluster(console, cluster.describe())
        console.print(f"\nnext: [bold]sparkcluster bootstrap {cluster.inventory_path}[/bold]")
    return EXIT_OK


def cmd_sim_down(args: argparse.Namespace) -> int:
    from .sim.state import existing_names

    names = existing_names() if args.all else [args.name]
    for name in names:
        SimCluster.load(name).down()
        if not args.json:
            console.print(f"removed simulated cluster [bold]{name}[/bold]")
    if args.json:
        _print_json({"removed": names})
    return EXIT_OK


def cmd_sim_list(args: argparse.Namespace) -> int:
    from .sim.state import existing_names

    clusters = [SimCluster.load(n).describe() for n in existing_names()]
    if args.json:
        _print_json(clusters)
        return EXIT_OK
    if not clusters:
        console.print("no simulated clusters (create one with `sparkcluster sim up 2`)")
    for doc in clusters:
        sim_render.cluster(console, doc)
    return EXIT_OK


def _host_action(action: Callable[[SimCluster, str], None], verb: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        cluster = SimCluster.load(args.name)
        action(cluster, args.host)
        console.print(f"{args.host}: {verb}")
        return EXIT_OK

    return run


def cmd_sim_ssh(args: argparse.Namespace) -> int:
    cluster = SimCluster.load(args.name)
    argv = cluster.ssh_argv(args.host, args.user, args.via) + args.remote
    os.execvp(argv[0], argv)
    return EXIT_OK  # not reached


def cmd_sim_exec(args: argparse.Namespace) -> int:
    command = args.remote
    if not command:
        raise UsageError("give a command after --", "e.g. `sparkcluster sim exec spark-1 -- ip -br addr`")
    return SimCluster.load(args.name).exec_in(args.host, command).returncode


def cmd_sim_image(args: argparse.Namespace) -> int:
    from .sim import image

    cluster = SimCluster.load(args.name)
    hosts = args.hosts.split(",") if args.hosts else [h.name for h in cluster.topology.hosts]
    for h in hosts:
        cluster.host(h)  # unknown names fail before anything is built
    tar = image.build(args.tag, rebuild=args.rebuild, ray_env=Path(args.ray_env) if args.ray_env else None,
                      with_torch=args.torch)
    image.import_into(cluster, hosts, args.tag, tar)
    console.print(f"image [bold]{args.tag}[/bold] ({tar.stat().st_size / 1e6:.0f} MB) imported on {', '.join(hosts)}")
    return EXIT_OK


# ---- parser ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkcluster",
        description="Take DGX Sparks from cabled to serving one model across all of them, with NCCL proven on RDMA.",
    )
    parser.add_argument("--version", action="version", version=f"sparkcluster {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def connecting(p: argparse.ArgumentParser, inventory_positional: bool = True) -> argparse.ArgumentParser:
        if inventory_positional:
            p.add_argument("inventory_arg", nargs="?", metavar="INVENTORY", help="inventory file")
        p.add_argument("-i", "--inventory", help="inventory file (else $SPARKCLUSTER_INVENTORY, ./inventory.yml, "
                                                  "then the one the last bootstrap used)")
        p.add_argument("--limit", help="comma-separated hosts or groups to act on")
        p.add_argument("--forks", type=int, default=DEFAULT_FORKS, help=f"hosts in parallel (default {DEFAULT_FORKS})")
        p.add_argument("--trust-new-host-keys", action="store_true",
                       help="accept and record host keys not yet in known_hosts (never a changed key)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    def changing(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--check", action="store_true", help="show what would change; change nothing")
        p.add_argument("--diff", action="store_true", help="show the changes made to files")
        p.add_argument("--ask-become-pass", "-K", action="store_true", help="ask once for the sudo password")
        return p

    facts = connecting(commands.add_parser("facts", help="gather and show each host's facts"))
    facts.set_defaults(func=cmd_facts)

    boot = changing(connecting(commands.add_parser(
        "bootstrap", help="preflight and provision every node (idempotent)")))
    boot.add_argument("--min-driver", help="lowest acceptable NVIDIA driver (default 590.44, or min_driver: in the inventory)")
    boot.add_argument("--driver-policy", choices=("fail", "warn"), help="what an older driver does (default fail)")
    boot.add_argument("--allow-other-gpu", action="store_true", help="go on when a node's GPU is not a GB10")
    boot.add_argument("--runtime", choices=("docker", "host"),
                      help="host: Ray and vLLM will run from a Python environment, so Docker is not checked "
                           "(default docker, or runtime: in the inventory)")
    boot.set_defaults(func=cmd_bootstrap)

    stg = connecting(commands.add_parser("stage", help="put a model's snapshot on every node, over the fabric"),
                     inventory_positional=False)
    stg.add_argument("model", help="ORG/NAME[@REVISION]")
    stg.add_argument("--source", default="auto",
                     help="auto (a node that holds it, else download on the head), head, local (this machine's "
                          "HF cache), or a host name")
    stg.add_argument("--verify", choices=("size", "full"), default="size",
                     help="check existing copies by size (default) or by hashing every blob")
    stg.add_argument("--status", action="store_true", help="report each node's copy; change nothing")
    stg.add_argument("--streams", type=int, default=2, help="files in flight per destination (default 2)")
    stg.add_argument("--over-lan", action="store_true", help=argparse.SUPPRESS)  # benchmarks only
    stg.set_defaults(func=cmd_stage)

    ver = connecting(commands.add_parser("verify", help="prove which network NCCL (or gloo) traffic really takes"))
    ver.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                     help="nccl on GPUs (auto when the head's torch sees CUDA), gloo on CPU-only nodes")
    ver.add_argument("--sizes", help="bytes per collective, e.g. 1M,64M,1G (at most 1 GiB)")
    ver.add_argument("--min-busbw", type=float, help="bus bandwidth a pass needs, GB/s")
    ver.set_defaults(func=cmd_verify)

    rep = commands.add_parser("nccl-report", help="read NCCL_DEBUG=INFO logs: transports, devices, a verdict")
    rep.add_argument("logfiles", nargs="+", metavar="LOGFILE")
    rep.add_argument("--min-busbw", type=float, help="bus bandwidth a pass needs, GB/s (probe output only)")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_nccl_report)

    run = changing(connecting(commands.add_parser("run", help="run a playbook"), inventory_positional=False))
    run.add_argument("playbook", help="playbook file")
    run.add_argument("-e", "--extra-vars", action="append", metavar="KEY=VALUE", help="a variable for templates")
    run.set_defaults(func=cmd_run)

    serve_cli.add_parsers(commands, connecting,
                          lambda p, fn: p.set_defaults(func=lambda args: fn(args, _connected)))

    sim = commands.add_parser("sim", help="a simulated Spark cluster on this machine (needs root)")
    sim_cmds = sim.add_subparsers(dest="sim_command", required=True, metavar="SIM_COMMAND")

    def named(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default: {DEFAULT_NAME})")
        return p

    up = named(sim_cmds.add_parser("up", help="create and boot N simulated Sparks"))
    up.add_argument("count", type=int, metavar="N", help="number of Sparks")
    up.add_argument("--driver", action="extend", nargs="+", metavar="VERSION",
                    help=f"NVIDIA driver version: one for all hosts or one per host (default: {DEFAULT_DRIVER})")
    up.add_argument("--docker", action=argparse.BooleanOptionalAction, default=True,
                    help="run a Docker engine in every host (default: on)")
    up.add_argument("--port0", action="extend", nargs="+", metavar="HOST",
                    help="cable QSFP port 0 instead of port 1 on these hosts (a common mistake)")
    up.add_argument("--lan-rate", default=DEFAULT_LAN_RATE,
                    help=f"rate limit of the 10 GbE management link (default: {DEFAULT_LAN_RATE})")
    up.add_argument("--user", default=DEFAULT_USER, help=f"login user with passwordless sudo (default: {DEFAULT_USER})")
    up.add_argument("--ssh-mesh", action=argparse.BooleanOptionalAction, default=True,
                    help="pre-install passwordless ssh between the hosts, as NVIDIA's setup does (default: on)")
    up.add_argument("--vllm-env", metavar="VENV",
                    help="a vLLM (CPU build) environment for `serve --runtime host`, e.g. .venv-vllm from "
                         "scripts/setup-vllm.sh: the inventory names it, with the settings a CPU vLLM needs")
    up.add_argument("--json", action="store_true", help="print the cluster as JSON")
    up.set_defaults(func=cmd_sim_up)

    down = sim_cmds.add_parser("down", help="remove a simulated cluster and everything it made")
    down.add_argument("name", nargs="?", default=DEFAULT_NAME, help=f"cluster name (default: {DEFAULT_NAME})")
    down.add_argument("--all", action="store_true", help="remove every simulated cluster")
    down.add_argument("--json", action="store_true")
    down.set_defaults(func=cmd_sim_down)

    ls = sim_cmds.add_parser("list", help="list simulated clusters")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_sim_list)

    for verb, action, done, help_text in (
        ("power-off", SimCluster.power_off, "powered off", "cut a host's power (every process dies, its disk stays)"),
        ("boot", SimCluster.boot, "booted", "boot a powered-off host"),
        ("reset", SimCluster.reset, "reset to a fresh disk and booted", "re-image a host: fresh disk, then boot"),
    ):
        p = named(sim_cmds.add_parser(verb, help=help_text))
        p.add_argument("host", help="host name, e.g. spark-2")
        p.set_defaults(func=_host_action(action, done))

    ssh = named(sim_cmds.add_parser("ssh", help="ssh into a host with the cluster's key and known_hosts"))
    ssh.add_argument("host")
    ssh.add_argument("--user", default=None)
    ssh.add_argument("--via", choices=("mgmt", "fabric"), default="mgmt")
    ssh.epilog = "a command to run goes after --, e.g. `sparkcluster sim ssh spark-1 -- hostname`"
    ssh.set_defaults(func=cmd_sim_ssh)

    ex = named(sim_cmds.add_parser("exec", help="run a command as root inside a host (no ssh)"))
    ex.add_argument("host")
    ex.epilog = "the command goes after --, e.g. `sparkcluster sim exec spark-1 -- ip -br addr`"
    ex.set_defaults(func=cmd_sim_exec)

    img = named(sim_cmds.add_parser("image", help="build the registry-free test image and docker-import it"))
    img.add_argument("--tag", default="vllm-node")
    img.add_argument("--hosts", help="comma-separated hosts (default: all)")
    img.add_argument("--rebuild", action="store_true")
    img.add_argument("--ray-env", metavar="VENV",
                     help="a venv made with /usr/bin/python3 holding ray[default]: the image then runs a real Ray")
    img.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                     help="keep PyTorch from the Ray venv (the probe needs it; --no-torch: a 3x smaller image)")
    img.set_defaults(func=cmd_sim_image)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Everything after `--` is a command for a remote host, never options of ours.
    remote = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = build_parser().parse_args(argv[: len(argv) - len(remote) - 1] if "--" in argv else argv)
    args.remote = remote
    try:
        return args.func(args)
    except SparkclusterError as e:
        err_console.print(f"[bold red]error:[/bold red] {escape(e.message)}", highlight=False)
        if e.fix:
            err_console.print(f"  [bold]fix:[/bold] {escape(e.fix)}", highlight=False)
        return e.exit_code
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
