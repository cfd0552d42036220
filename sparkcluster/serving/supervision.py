"""serve's and down's side of the supervisor: stopped first (it would take a serve's own restart for a fault), then,
after a serve that answers, installed and started on the head (supervisor_unit.py) unless --no-supervise. A head that
cannot run it leaves the serve served and says why, with the fix: the serve itself succeeded."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.session import Session
from ..engine.transport import Unreachable
from .apikey import key_to_env
from .incidents import SUPERVISOR_DIR
from .nodes import node_env
from .phases import ServeOptions
from .supervisor_unit import SUPERVISED_ENV, SupervisorSpec, forget_spec, install, serve_argv_for_head, stop_command

KEPT_RECORD = f"{SUPERVISOR_DIR}/record.json"  # the serve record the supervisor keeps (supervise/loop.py)


@dataclass(frozen=True)
class SupervisorOutcome:
    state: str  # "watching", "off" (--no-supervise), "not started", "the supervisor's own serve"
    why: str | None = None
    fix: str | None = None
    copied_bytes: int = 0


    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "why": self.why, "fix": self.fix, "copied_bytes": self.copied_bytes}


def supervised_run() -> bool:
    """True inside the serve the supervisor itself runs: it must neither stop nor reinstall itself."""
    return os.environ.get(SUPERVISED_ENV) == "1"


def supervisor_stopped(session: Session, forget: bool = False) -> bool:
    """Stops the head's supervisor (idempotent); True when one was running. `forget` (down): also the serve it kept,
    so that `supervise on` later serves nothing that was stopped on purpose."""
    if supervised_run():
        return False
    try:
        stopped = "supervisor" in session.run(session.head, stop_command()).stdout
        if forget:
            session.run(session.head, Command(f"rm -f {KEPT_RECORD}"))
        return stopped
    except Unreachable:
        return False


def supervise_after_serve(session: Session, args: argparse.Namespace, opts: ServeOptions) -> SupervisorOutcome:
    if supervised_run():
        return SupervisorOutcome("the supervisor's own serve")
    if not getattr(args, "supervise", True):
        forget_spec(session)  # `supervise on` must not watch an earlier serve's flags
        return SupervisorOutcome("off", "serve --no-supervise", "serve without it to have it watched")
    if opts.recipe.mods:
        return SupervisorOutcome("not started", "the recipe's mods are files of this machine, which a restart on "
                                 "the head would not find", "serve the recipe by hand after a fault")
    if opts.recipe.source and Path(opts.recipe.source).is_file() and not opts.recipe.registry:
        return SupervisorOutcome("not started", f"the recipe is a file of this machine ({opts.recipe.source}), which a "
                                 "restart on the head would not find", "serve a bundled or registry recipe, or "
                                 "pass its flags to serve")
    own = getattr(args, "own_argv", None) or []
    # The secrets given by flag after `--` (the API key, the HF token) leave the flags the head keeps, for the env
    # its inventory gives vLLM: a restart's command line is readable by every user of the head.
    remote, secrets = key_to_env(tuple(getattr(args, "remote", ())), {})
    spec = SupervisorSpec(serve_argv_for_head(own), remote, getattr(args, "notify", None),
                          ready_timeout_s=opts.ready_timeout)
    api_key = node_env(session.inventory, session.head, opts.serve_args().env).api_key
    try:
        installed = install(session, spec, api_key, secrets)
    except SparkclusterError as e:
        return SupervisorOutcome("not started", e.message, e.fix)
    return SupervisorOutcome("watching", copied_bytes=installed.copied_bytes)
