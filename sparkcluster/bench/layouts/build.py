"""Which build of vLLM served the figures: the vLLM distribution's version in the head's serving environment (the
container, or the host runtime's python_env), read the way the probe runs there. `/version` gives the release
alone (`0.32.0`); the distribution keeps the build's local label (`0.32.0+cpu` for the CPU build the simulator
runs), which is what says the figures are not a GPU's."""

from __future__ import annotations

from dataclasses import replace

from ...engine.errors import UsageError
from ...engine.session import Session
from ...serving.nodes import node_env
from ...serving.runtime import RuntimeChoice
from ...serving.status import recorded

VERSION_ARGV = ["python3", "-c", "import importlib.metadata as m; print(m.version('vllm'))"]


def served_vllm(session: Session, chosen: RuntimeChoice) -> str | None:
    """The version, or None where it cannot be read (unknown is a value: the figures then say nothing of it)."""
    _, runtime = recorded(session, chosen)
    head = session.head
    try:
        command = runtime.on(head).run_in_env(VERSION_ARGV, node_env(session.inventory, head))
    except UsageError:  # the inventory no longer says where the host runtime's environment is
        return None
    result = session.run(head, replace(command, timeout=60))
    lines = result.stdout.strip().splitlines() if result.ok else []
    return lines[-1].strip() if lines else None


def is_cpu_build(version: str | None) -> bool:
    return version is not None and "+cpu" in version
