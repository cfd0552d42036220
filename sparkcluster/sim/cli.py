"""`sparkcluster sim ...`: the simulated cluster's sub-commands, wired from parsed flags to SimCluster."""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from ..engine.cliapp import App
from ..engine.console import err as err_console
from ..engine.console import out as console
from ..engine.errors import EXIT_OK, UsageError
from ..engine.report import print_json
from . import render as sim_render
from .cluster import SimCluster
from .hardware import CLOCK_EVENTS, JOURNAL_STORAGE, SETTINGS, kernel_log_entry
from .options import DEFAULT_DRIVER, DEFAULT_LAN_RATE, DEFAULT_NAME, DEFAULT_USER, UpOptions
from .shaping import check_degrade
from .state import existing_names
from .topology import MISCABLES, TOPOLOGIES


def cmd_sim_up(args: argparse.Namespace) -> int:
    opts = UpOptions(
        count=args.count, name=args.name, drivers=tuple(args.driver or [DEFAULT_DRIVER]),
        port0_hosts=frozenset(args.port0 or []), docker=args.docker, lan_rate=args.lan_rate,
        user=args.user, ssh_mesh=args.ssh_mesh, fabric_addresses=args.fabric_addresses,
        rdma_names=args.rdma_names, link_local=args.link_local, topology=args.topology, miscable=args.miscable or "",
        vllm_env=str(Path(args.vllm_env).resolve()) if args.vllm_env else None,
    )
    with err_console.status(f"booting {args.count} simulated Spark(s)…", spinner="dots") if not args.json else nullcontext():
        cluster = SimCluster.up(opts)
    if args.json:
        print_json(cluster.describe())
    else:
        sim_render.cluster(console, cluster.describe())
        console.print(f"\nnext: [bold]sparkcluster bootstrap {cluster.inventory_path}[/bold]")
    return EXIT_OK


def cmd_sim_down(args: argparse.Namespace) -> int:
    names = existing_names() if args.all else [args.name]
    for name in names:
        SimCluster.load(name).down()
        if not args.json:
            console.print(f"removed simulated cluster [bold]{name}[/bold]")
    if args.json:
        print_json({"removed": names})
    return EXIT_OK


def cmd_sim_list(args: argparse.Namespace) -> int:
    clusters = [SimCluster.load(n).describe() for n in existing_names()]
    if args.json:
        print_json(clusters)
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


def cmd_sim_degrade(args: argparse.Namespace) -> int:
    if args.clear and (args.rate or args.delay):
        raise UsageError("--clear lifts every limit: it takes no --rate or --delay", "give --clear alone")
    if not (args.clear or args.rate or args.delay):
        raise UsageError("sim degrade needs --rate, --delay (or both), or --clear",
                         "e.g. `sparkcluster sim degrade spark-2 1 --delay 2ms`")
    check_degrade(args.rate, args.delay)
    netdev = SimCluster.load(args.name).degrade(args.host, args.twin, args.rate, args.delay)
    held = [f"held to {args.rate}"] * bool(args.rate) + [f"{args.delay} later each way"] * bool(args.delay)
    console.print(f"{args.host} {netdev}: {', '.join(held) or 'no limit'}")
    return EXIT_OK


def cmd_sim_hardware(args: argparse.Namespace) -> int:
    settings: dict[str, object] = {k: getattr(args, k) for k in ("driver", "kernel", "bios_version", "bios_date",
                                                                 "cma_total_kb", "firmware", "gpu_temp_c", "power_w",
                                                                 "sm_clock_mhz", "journal") if getattr(args, k) is not None}
    for flag, value, low, high in (("--gpu-temp", args.gpu_temp_c, 0, 150), ("--power-w", args.power_w, 0, 1000),
                                   ("--sm-clock", args.sm_clock_mhz, 1, 5000)):
        if value is not None and not low <= value <= high:
            raise UsageError(f"{flag} {value:g} is outside what a GB10 reports ({low} to {high})",
                             "e.g. --gpu-temp 92 --power-w 95 --sm-clock 1534")
    if args.throttle:
        settings["throttle"] = list(dict.fromkeys(args.throttle))
    if args.pcie_width:
        widths = {}
        for pair in args.pcie_width:
            netdev, sep, width = pair.partition("=")
            if not sep or not width.isdigit():
                raise UsageError(f"--pcie-width {pair!r} is not NETDEV=WIDTH", "e.g. --pcie-width enP2p1s0f1np1=2")
            widths[netdev] = width
        settings["pcie_width"] = widths
    now = time.time()
    planted = {key: [kernel_log_entry(message, now + i * 1e-6) for i, message in enumerate(given or [])]
               for key, given in (("kernel_log", args.kernel_log), ("kernel_log_previous", args.kernel_log_previous))}
    cluster = SimCluster.load(args.name)
    for key, lines in planted.items():
        if lines:  # appended to what that boot's kernel already logged (nothing, after --clear)
            logged = [] if args.clear else cluster.state.hardware.get(args.host, {}).get(key, [])
            settings[key] = [*logged, *lines]
    if args.clear:  # every default back, then what this command gives
        settings = {**dict.fromkeys(SETTINGS), **settings}
    cluster.set_hardware(args.host, settings)
    shown = {k: (f"{len(planted[k])} line(s) more" if planted.get(k) else v) for k, v in settings.items()}
    console.print(f"{args.host}: {', '.join(f'{k}={v}' for k, v in shown.items()) or 'unchanged'}", highlight=False)
    return EXIT_OK


def cmd_sim_exec(args: argparse.Namespace) -> int:
    command = args.remote
    if not command:
        raise UsageError("give a command after --", "e.g. `sparkcluster sim exec spark-1 -- ip -br addr`")
    return SimCluster.load(args.name).exec_in(args.host, command).returncode


def cmd_sim_image(args: argparse.Namespace) -> int:
    from . import image  # builds with docker: loaded only when asked

    cluster = SimCluster.load(args.name)
    hosts = args.hosts.split(",") if args.hosts else [h.name for h in cluster.topology.hosts]
    for h in hosts:
        cluster.host(h)  # unknown names fail before anything is built
    tar = image.build(args.tag, rebuild=args.rebuild, ray_env=Path(args.ray_env) if args.ray_env else None,
                      with_torch=args.torch)
    image.import_into(cluster, hosts, args.tag, tar)
    console.print(f"image [bold]{args.tag}[/bold] ({tar.stat().st_size / 1e6:.0f} MB) imported on {', '.join(hosts)}")
    return EXIT_OK


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    """`sim` connects to nothing of an inventory: it makes the hosts."""
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
    up.add_argument("--topology", choices=TOPOLOGIES, default="switch",
                    help="how the QSFP ports are cabled: switch (every node's port on one switch, today's default), "
                         "pair (2 nodes, one cable) or ring (3 to 8 nodes, port 1 of each to port 0 of the next)")
    up.add_argument("--miscable", choices=MISCABLES,
                    help="make one cabling mistake: port0-port0 (a ring's cable from port 0 to port 0), self (the "
                         "last node cabled to itself), missing-link (a ring's last cable left out), mixed (two nodes "
                         "direct, the rest on a switch), pinned-away (spark-2 cabled in port 0, its inventory "
                         "pinned to port 1)")
    up.add_argument("--lan-rate", default=DEFAULT_LAN_RATE,
                    help=f"rate limit of the 10 GbE management link (default: {DEFAULT_LAN_RATE})")
    up.add_argument("--user", default=DEFAULT_USER, help=f"login user with passwordless sudo (default: {DEFAULT_USER})")
    up.add_argument("--ssh-mesh", action=argparse.BooleanOptionalAction, default=True,
                    help="pre-install passwordless ssh between the hosts, as NVIDIA's setup does (default: on)")
    up.add_argument("--fabric-addresses", action=argparse.BooleanOptionalAction, default=True,
                    help="address the cabled QSFP twins (default: on); --no-fabric-addresses: fresh from the box, "
                         "up but unaddressed at MTU 1500, for `bootstrap` to address them")
    up.add_argument("--rdma-names", choices=("roce", "mlx5"), default="roce",
                    help="RDMA device names: roce (rocep1s0f1, as DGX OS names them) or mlx5 (mlx5_0..3, as some "
                         "kernels do); default: roce")
    up.add_argument("--link-local", action="store_true",
                    help="the cabled twins as NVIDIA's playbook leaves them: 169.254.0.0/16 on both, MTU 1500, for "
                         "`bootstrap` to replace (implies --no-fabric-addresses)")
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

    deg = named(sim_cmds.add_parser("degrade", help="hold one QSFP twin of a host to a rate (a degraded link) or "
                                                     "delay it (a link slow for small messages)"))
    deg.add_argument("host", help="host name, e.g. spark-2")
    deg.add_argument("twin", help="the twin's netdev (e.g. enP2p1s0f1np1), or 0/1")
    deg.add_argument("--rate", help="a tc rate, e.g. 2gbit")
    deg.add_argument("--delay", help="a delay each way, e.g. 2ms: netem, or where the kernel has none an NFQUEUE "
                                     "daemon (with --rate too: both)")
    deg.add_argument("--clear", action="store_true", help="lift the rate and the delay")
    # `--delay -1ms` is a bad value, not an unknown option: argparse (before 3.13) takes only plain numbers for
    # negative values, so the check that names what is wrong with it would never see it.
    deg._negative_number_matcher = re.compile(r"^-\.?\d")
    deg.set_defaults(func=cmd_sim_degrade)

    hw = named(sim_cmds.add_parser("hardware", help="give one host another driver, kernel, BIOS, CMA pool, "
                                                     "ConnectX firmware or twin PCIe width (what nodes differ in), "
                                                     "its GPU's temperature, power, clock and throttling, or lines "
                                                     "in its kernel log"))
    hw.add_argument("host", help="host name, e.g. spark-2")
    hw.add_argument("--driver", help="NVIDIA driver version, e.g. 580.95.05")
    hw.add_argument("--kernel", help="what `uname -r` prints, e.g. 7.0.0-1019-nvidia")
    hw.add_argument("--bios-version", help="/sys/class/dmi/id/bios_version")
    hw.add_argument("--bios-date", help="/sys/class/dmi/id/bios_date, MM/DD/YYYY")
    hw.add_argument("--cma-total-kb", type=int, help="CmaTotal of /proc/meminfo, in kB (0: no CMA pool)")
    hw.add_argument("--firmware", help="ConnectX firmware `ethtool -i` reports")
    hw.add_argument("--pcie-width", action="append", metavar="NETDEV=WIDTH",
                    help="the PCIe width a twin negotiated (of x4), e.g. enP2p1s0f1np1=2")
    hw.add_argument("--gpu-temp", dest="gpu_temp_c", type=int, metavar="C",
                    help="the GPU temperature nvidia-smi reports, in C (idle: 41)")
    hw.add_argument("--power-w", type=float, metavar="W", help="the GPU power draw nvidia-smi reports (idle: 4.52)")
    hw.add_argument("--sm-clock", dest="sm_clock_mhz", type=int, metavar="MHZ",
                    help="the SM clock nvidia-smi reports, in MHz (idle: 208; under load about 2400)")
    hw.add_argument("--throttle", action="append", choices=tuple(CLOCK_EVENTS), metavar="REASON",
                    help="a clocks-event reason nvidia-smi reports active (repeatable; replaces gpu_idle), one of "
                         f"{', '.join(CLOCK_EVENTS)}")
    hw.add_argument("--kernel-log", action="append", metavar="LINE",
                    help="append a line to the kernel log the host's journalctl -k and dmesg print, as the kernel "
                         "wrote it, e.g. 'NVRM: Xid (PCI:000f:01:00): 79, pid=2113, name=python3, GPU has fallen off "
                         "the bus.' (repeatable; --clear empties the log)")
    hw.add_argument("--kernel-log-previous", action="append", metavar="LINE",
                    help="append a line to the PREVIOUS boot's kernel log (what journalctl -k -b -1 prints; dmesg "
                         "holds this boot alone), e.g. the Xid a node crashed with (repeatable; none: the journal "
                         "holds no earlier boot)")
    hw.add_argument("--journal", choices=JOURNAL_STORAGE,
                    help="where journald keeps the journal: persistent (on disk, the default, as on DGX OS) or "
                         "volatile (in memory: journalctl -b -1 finds no persistent journal)")
    hw.add_argument("--clear", action="store_true",
                    help="put every simulated default back (and the kernel log empty) before the other flags apply")
    hw.set_defaults(func=cmd_sim_hardware)

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
