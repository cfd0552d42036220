"""What the simulated cluster's serve tests share: the image tag and Ray env of the Docker serve, where a process runs,
the host runtime's vLLM environment and a node's process list."""

from __future__ import annotations

from pathlib import Path

from sparkcluster.sim import SimCluster
from tests.support.helpers import ssh

RAY_ENV = Path(__file__).resolve().parents[2] / ".venv-ray"
TAG = "vllm-node"


def running_anywhere(c: SimCluster) -> list[str]:
    """The powered-on hosts where a vllm_node container runs."""
    return [h.name for h in c.topology.hosts if c.is_running(h)
            and ssh(c, h.name, "docker ps -q --filter name=vllm_node", check=False).stdout.strip()]


ROOT = Path(__file__).resolve().parents[2]
VLLM_ENV = ROOT / ".venv-vllm"


def processes(c: SimCluster, host: str) -> str:
    """What runs on `host`, less zombies: a process that has exited and that its parent (the host's init, for a
    daemon) has not reaped yet holds no memory; `[raylet] <defunct>` was seen right after `ray stop --force`."""
    out = c.exec_in(host, ["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
    return "\n".join(line for line in out.splitlines() if not line.endswith("<defunct>"))
