"""`sparkcluster doctor`: wiring from parsed flags to the doctor's run, its output and its exit code."""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path

from ..engine import flags
from ..engine.cliapp import App, Connect
from ..engine.console import err as err_console
from ..engine.console import out as console
from ..engine.errors import EXIT_FAILED, EXIT_OK, SparkclusterError, UsageError
from ..engine.localfiles import check_replaceable
from ..engine.report import print_json
from ..engine.scrub import Scrubber
from ..engine.session import Session
from ..serving.launch import DEFAULT_IMAGE, RUNTIMES
from ..serving.record import read_record
from ..serving.runtime import FROM_FLAG, ClusterRuntime, cluster_runtime
from . import baseline, bundle
from .render import render
from .run import run_doctor
from .upgrades import Upgrades, read_upgrades


def image_to_check(session: Session, given: str | None, runtime: ClusterRuntime) -> str:
    """--image; else none where Ray and vLLM run from a Python environment (the host runtime: --runtime, else the
    last serve's, else the inventory's); else the image the last serve ran, else the default one."""
    if given:
        return given
    try:
        record = read_record(session) if session.head.name in session.facts else None
    except SparkclusterError:
        record = None  # an unreadable record is serve's to report; the doctor checks the default image then
    if record is not None and runtime.source != FROM_FLAG:
        return record.image if record.runtime == "docker" else ""
    if runtime.name == "host":
        return ""
    return record.image if record is not None and record.runtime == "docker" else DEFAULT_IMAGE


def bundle_path(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.name.endswith((".tar.gz", ".tgz")):
        raise UsageError(f"--bundle {text}: the bundle is a gzipped tar", "name it FILE.tar.gz")
    if not path.parent.is_dir():
        raise UsageError(f"--bundle {text}: no folder {path.parent}", "create it first, or name a file in an existing one")
    if path.is_dir():
        raise UsageError(f"--bundle {text}: {path} is a folder", f"name a file in it, e.g. {path}/bundle.tar.gz")
    check_replaceable(path, f"--bundle {text}", "name a regular file, e.g. ~/sparkcluster-bundle.tar.gz")
    try:  # the one sure test: make a file there as the bundle will (access() says yes to root on /proc)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
    except OSError as e:
        raise UsageError(f"--bundle {text}: cannot create a file in {path.parent} ({e.strerror or e})",
                         "name a file in a folder you can write, e.g. ~/sparkcluster-bundle.tar.gz") from None
    os.close(fd)
    os.unlink(probe)
    return path


def cmd_doctor(args: argparse.Namespace, connect: Connect) -> int:
    target = bundle_path(args.bundle) if args.bundle else None  # bad input fails before anything connects
    compare_with, save_as = getattr(args, "baseline", None), getattr(args, "save_baseline", None)
    saved = baseline.read(compare_with) if compare_with else None
    save_to = baseline.writable(save_as) if save_as else None
    collected: bundle.Bundle | None = None
    current: baseline.Baseline | None = None
    pending: Upgrades | None = None
    with connect(args, require_all=False) as session:
        runtime = cluster_runtime(session.inventory, getattr(args, "runtime", None))
        image = image_to_check(session, args.image, runtime)
        if not args.image and (runtime.name == "host") != (not image):  # the last serve ran the other one
            runtime = ClusterRuntime("docker" if image else "host", "the last serve's, recorded on the head")
        if not args.json:
            err_console.print(runtime.shown(), highlight=False)
        report = run_doctor(session, image, image_named=bool(args.image), runtime=runtime.name)
        if getattr(args, "upgrades", False):  # each node's pending kernel, driver and firmware against the table
            pending = read_upgrades(session, list(report.nodes))
            report = dataclasses.replace(report, findings=report.findings + tuple(pending.findings()))
        if saved is not None or save_to is not None:
            current = baseline.baseline_of(report.nodes, baseline.last_verify_records(session, list(report.nodes)))
        if target is not None:
            collected = bundle.collect(session, report)
            scrubber = Scrubber(bundle.known_secrets(session))
    unwritten: UsageError | None = None
    if target is not None and collected is not None:
        try:  # the folder was writable when the doctor began; a disk that fills or a folder removed since is told
            bundle.write(collected, target, scrubber)
        except OSError as e:
            unwritten = UsageError(f"--bundle {target}: the bundle could not be written ({e.strerror or e}); the "
                                   "doctor's report above is complete", "free space there or name a file in a folder "
                                   "you can write, and run the doctor again")
    written = target is not None and collected is not None and unwritten is None
    changes = baseline.compare(saved, current) if saved is not None and current is not None else []
    if save_to is not None and current is not None and unwritten is None:
        try:  # compared first: the same FILE for both flags is compared with, then replaced
            baseline.write(current, save_to)
        except OSError as e:
            unwritten = UsageError(f"--save-baseline {save_to}: the baseline could not be written ({e.strerror or e}); "
                                   "the doctor's report above is complete", "free space there or name a file in a "
                                   "folder you can write, and run the doctor again")
    saved_to = save_to if save_to is not None and current is not None and unwritten is None else None
    if args.json:
        print_json(report.to_json() | ({"bundle": str(target)} if written else {})
                   | ({"upgrades": pending.to_json()} if pending is not None else {})
                   | baseline.json_of(saved, compare_with, changes, saved_to))
    else:
        render(console, report)
        baseline.render(console, saved, compare_with, changes, current, saved_to)
        if written and collected is not None:
            absent = sum(v != "present" for items in collected.items.values() for v in items.values())
            scrubbed = sum(n for kinds in collected.scrubbed.values() for n in kinds.values())
            console.print(f"bundle: {target} ({len(collected.files)} files from {len(collected.items)} nodes, "
                          f"{absent} items absent, {scrubbed} secrets scrubbed; see MANIFEST.json)", highlight=False)
    if unwritten is not None:
        raise unwritten  # after the table: the report is never lost to the bundle
    return EXIT_FAILED if report.failed or any(c.bad for c in changes) else EXIT_OK


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    doc = app.connecting(commands.add_parser(
        "doctor", help="every check that needs no serving: preflight, nodes compared, known-bad values"))
    doc.add_argument("--runtime", choices=RUNTIMES,
                     help="host: no Docker or image checks (default: the inventory's `runtime`, which `bootstrap "
                          "--runtime` records, else the last serve's, else docker)")
    doc.add_argument("--image", type=flags.image,
                     help="the container image to compare across nodes, which must then be on every node (default: "
                          "the last serve's, else vllm-node; one not there yet is a warning: serve sends it)")
    doc.add_argument("--bundle", metavar="FILE.tar.gz",
                     help="also write a support bundle: every node's facts, comm env, netplan, RDMA and ethtool "
                          "views, kernel mlx5 lines, nvidia-smi -q, versions, last verify, serve record and log tails; "
                          "secrets scrubbed (MANIFEST.json says what)")
    doc.add_argument("--save-baseline", metavar="FILE.json",
                     help="also save each node's versions (kernel, driver, BIOS, ConnectX firmware, NCCL, CUDA, DGX OS), "
                          "limits (memlock, CMA) and figures (memory, the last verify's busbw) to FILE.json")
    doc.add_argument("--baseline", metavar="FILE.json",
                     help="name what changed on each node since --save-baseline wrote FILE.json (run it after every "
                          "apt upgrade and reboot); fails where a change lands on a known-bad value or a figure fell "
                          "(busbw down more than 10%%, CMA to 0)")
    doc.add_argument("--upgrades", action="store_true",
                     help="also read each node's pending upgrades (apt-get -s dist-upgrade, fwupdmgr get-updates) and "
                          "name every kernel, NVIDIA driver or firmware the known-bad table holds back, with its line, "
                          "before anyone upgrades")
    doc.add_argument("--ask-become-pass", "-K", action="store_true",
                     help="ask once for the sudo password (the bundle reads the netplan file and the kernel log as root)")
    app.wire(doc, cmd_doctor)
