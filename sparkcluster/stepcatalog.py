"""Every step a playbook may name: the engine's own and those the wings register (the node's, `models.stage`). Loading a
playbook through here is what lets the engine stay ignorant of the wings while bootstrap.yml uses theirs."""

from __future__ import annotations

from pathlib import Path

from .engine import steps as _engine_steps  # noqa: F401 (registers)
from .engine.playbook import Playbook, bundled, load_playbook
from .node import steps as _node_steps  # noqa: F401 (registers)
from .staging import step as _staging_steps  # noqa: F401 (registers)

__all__ = ["Playbook", "bundled", "load", "load_bundled"]


def load(path: str | Path) -> Playbook:
    return load_playbook(path)


def load_bundled(name: str) -> Playbook:
    return load_playbook(bundled(name))
