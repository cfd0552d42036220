"""`sparkcluster doctor`: wiring from parsed flags to the doctor's run, its output and its exit code."""

from __future__ import annotations

import argparse

from ..engine import flags
from ..engine.cliapp import App, Connect
from ..engine.console import out as console
from ..engine.errors import EXIT_FAILED, EXIT_OK, SparkclusterError
from ..engine.report import print_json
from ..engine.session import Session
from ..serving.launch import DEFAULT_IMAGE
from ..serving.record import read_record
from .render import render
from .run import run_doctor


def image_to_check(session: Session, given: str | None) -> str:
    """--image, else the image the last serve ran, else the default one; none where the inventory runs Ray and
    vLLM from a Python environment (runtime: host)."""
    if given:
        return given
    try:
        record = read_record(session) if session.head.name in session.facts else None
    except SparkclusterError:
        record = None  # an unreadable record is serve's to report; the doctor checks the default image then
    if record is not None:
        return record.image if record.runtime == "docker" else ""
    return "" if str(session.inventory.vars.get("runtime", "docker")) == "host" else DEFAULT_IMAGE


def cmd_doctor(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args, require_all=False) as session:
        report = run_doctor(session, image_to_check(session, args.image))
    if args.json:
        print_json(report.to_json())
    else:
        render(console, report)
    return EXIT_FAILED if report.failed else EXIT_OK


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    doc = app.connecting(commands.add_parser(
        "doctor", help="every check that needs no serving: preflight, nodes compared, known-bad values"))
    doc.add_argument("--image", type=flags.image,
                     help="the container image to compare across nodes (default: the last serve's, else vllm-node)")
    app.wire(doc, cmd_doctor)
