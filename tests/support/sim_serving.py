"""What the simulated cluster's serve tests share: the image tag and Ray env of the Docker serve, where a process runs,
the host runtime's vLLM environment and a node's process list."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparkcluster.sim import SimCluster, UpOptions, tinymodel
from tests.support import vllm_model_info
from tests.support.helpers import require_sim, run_cli, ssh, unique_name

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


MODEL = "local/tiny-llama"
VLLM_FLAGS = ["--", "--max-model-len", "512", "--enforce-eager"]


@contextmanager
def vllm_pair(config: Path, name: str) -> Iterator[SimCluster]:
    """Two Sparks without Docker serving the real CPU vLLM: the inventory names the vLLM environment (python_env),
    the host runtime and the CPU vLLM's settings, the simulator's Ray plugin among them (tests/vllm_cpu_plugin). The
    twins hold link-local addresses until bootstrap gives them the fabric's, and the RDMA devices are mlx5_N. The
    tiny model is on the head only: serve stages it to the worker."""
    require_sim(docker=False)
    if not (VLLM_ENV / "bin" / "vllm").exists():
        pytest.fail(f"{VLLM_ENV} is missing: run scripts/setup-vllm.sh")
    c = SimCluster.up(UpOptions(count=2, name=unique_name(name), docker=False, vllm_env=str(VLLM_ENV),
                                rdma_names="mlx5", link_local=True))
    try:
        host_bootstrap(c, config)
        tinymodel.generate_on(c, "spark-1", str(VLLM_ENV / "bin" / "python"))
        vllm_model_info.lay_on(c, VLLM_ENV)
        yield c
    finally:
        c.down()


def host_bootstrap(c: SimCluster, config: Path) -> None:
    result = run_cli("bootstrap", str(c.inventory_path), "--runtime", "host", env={"XDG_CONFIG_HOME": str(config)})
    assert result.returncode == 0, result.stdout + result.stderr


def sc(c: SimCluster, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(args[0], "-i", str(c.inventory_path), *args[1:], timeout=timeout, env=env)  # before any `--`
