"""Every step a playbook may name: the engine's own and those the wings register (the node's, `models.stage`). Loading a
playbook through here is what lets the engine stay ignorant of the wings while bootstrap.yml uses theirs. Each
step's module is imported only when a playbook names the step."""

from __future__ import annotations

from pathlib import Path

from ..engine import steps as _engine_steps  # noqa: F401 (declares)
from ..engine.playbook import Playbook, bundled, load_playbook
from ..engine.steps.base import declare
from ..node import steps as _node_steps  # noqa: F401 (declares)

# Declared, not imported: a step's module loads when a playbook names it (engine.steps.base.StepRegistry), so a
# playbook without models.stage never imports staging.
declare("sparkcluster.staging.step", "models.stage")

__all__ = ["Playbook", "bundled", "load", "load_bundled"]


def load(path: str | Path) -> Playbook:
    return load_playbook(path)


def load_bundled(name: str) -> Playbook:
    """A playbook shipped in the package, its steps imported as their plays run (tests/unit/bootstrap/test_step_catalog.py
    loads each with every check, as `load` does)."""
    return load_playbook(bundled(name), defer_steps=True)
