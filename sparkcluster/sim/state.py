"""Where simulated clusters live on disk, and the lock under which their subnets are chosen."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_ROOT = "/var/lib/sparkcluster/sim"


def sim_root() -> Path:
    # Docker's overlay2 data-root lives under here, so it must be a real filesystem (not overlayfs).
    return Path(os.environ.get("SPARKCLUSTER_SIM_ROOT", DEFAULT_ROOT))


@contextmanager
def locked() -> Iterator[None]:
    """Serialise subnet choice and creation, so two `sim up` runs never pick the same subnets."""
    root = sim_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass
class HostState:
    unshare_pid: int = 0  # the outer `unshare` process; its only child is the host's PID 1 (sshd)
    pid1: int = 0


@dataclass
class ClusterState:
    """Everything needed to rebuild the topology and to find what a cluster started."""

    name: str
    count: int
    k: int
    drivers: list[str]
    port0_hosts: list[str]
    docker: bool
    lan_rate: str
    user: str
    uid: int
    ssh_mesh: bool
    vllm_env: str = ""  # a CPU vLLM environment the inventory names for `serve --runtime host`
    fabric_addresses: bool = True  # False: the cabled twins come up without addresses, as from the box
    rdma_names: str = "roce"  # "mlx5": RDMA devices named mlx5_N, as some kernels name them
    link_local: bool = False  # the cabled twins come up as NVIDIA's playbook leaves them: 169.254/16, MTU 1500
    topology: str = "switch"  # how the QSFP ports are cabled: switch, pair or ring (sim/topology.py)
    miscable: str = ""  # one cabling mistake made on purpose (sim/topology.py MISCABLES)
    docker_runtime: str = ""  # runc wrapper path, where this machine's capability set needs one
    storage_driver: str = "overlay2"
    status: str = "creating"
    hosts: dict[str, HostState] = field(default_factory=dict)
    forward_rules: list[list[str]] = field(default_factory=list)  # iptables rules we added, to delete on down
    hardware: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> what `sim hardware` gave it

    @property
    def dir(self) -> Path:
        return sim_root() / self.name

    def save(self) -> None:
        tmp = self.dir / "cluster.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(self.dir / "cluster.json")

    @classmethod
    def load(cls, name: str) -> ClusterState:
        data = json.loads((sim_root() / name / "cluster.json").read_text())
        data["hosts"] = {h: HostState(**s) for h, s in data.get("hosts", {}).items()}
        return cls(**data)


def existing_names() -> list[str]:
    root = sim_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "cluster.json").is_file())
