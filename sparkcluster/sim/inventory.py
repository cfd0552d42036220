"""The inventory `sim up` writes for its cluster: sparkcluster's own format, usable as is
(`sparkcluster bootstrap <file>`), with what the simulated hosts need that a real Spark would not."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from .state import ClusterState
from .topology import Topology

# The simulator's own vLLM platform plugin (tests/vllm_cpu_plugin, which scripts/setup-vllm.sh installs in the CPU
# vLLM's environment) turns on with this variable, in every vLLM process, Ray's workers included: with it vLLM's CPU
# build runs under Ray (the default launcher) across the simulated hosts. Never on a real Spark: its GPU needs none.
CPU_RAY_SWITCH = "SPARKCLUSTER_TEST_CPU_RAY"
CPU_RAY_PLUGIN = "sparkcluster_test_vllm_cpu_plugin"  # its distribution, as installed


def has_cpu_ray_plugin(vllm_env: str) -> bool:
    """Whether the CPU vLLM environment holds the plugin (its dist-info in site-packages)."""
    return any(Path(vllm_env).glob(f"lib/python3*/site-packages/{CPU_RAY_PLUGIN}-*.dist-info"))


def inventory_doc(state: ClusterState, topology: Topology, client_key: Path, known_hosts: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": state.name,
        "vars": {
            "user": state.user,
            "key": str(client_key),
            "known_hosts": str(known_hosts),
            # The hosts see this machine's files through their lower layer: the interpreter running
            # sparkcluster (with torch, where installed) serves as the nodes' Python for verify.
            "python": sys.executable,
            # Ray finds a Spark's GB10 by itself; the emulated GPU is invisible to it, so declare it.
            "ray_num_gpus": 1,
        },
        "hosts": {
            h.name: {"address": h.mgmt_ip, "role": "head" if h.index == 1 else "worker"}
            for h in topology.hosts
        },
    }
    for host, netdev in topology.pins:  # --miscable pinned-away: a pin the cabling contradicts
        doc["hosts"][host]["qsfp_interface"] = netdev
    fabric: dict[str, Any] = {}
    if topology.kind != "switch":  # what the inventory says the cables form (a miscabled one contradicts it)
        fabric["topology"] = topology.kind
    if not state.fabric_addresses:
        # bootstrap addresses the twins; inside this cluster's own subnets, which cannot leave the machine (a
        # ring's further subnets follow these two: 10.K.2.0/24, 10.K.3.0/24 ...).
        fabric["subnets"] = [str(n) for n in topology.subnets.fabric]
    if fabric:
        doc["vars"]["fabric"] = fabric
    if state.vllm_env:
        # A CPU build of vLLM stands in for a Spark's: a small KV cache, and one core per
        # host, since with automatic binding every host's rank picks core 0.
        doc["vars"]["python_env"] = state.vllm_env
        # The CPU vLLM runs from that environment, so the cluster's runtime is the host's: every command (bootstrap,
        # serve, status, logs, down, doctor) follows it without --runtime.
        doc["vars"]["runtime"] = "host"
        doc["vars"]["serve_env"] = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", CPU_RAY_SWITCH: "1"}
        cores = os.cpu_count() or 1
        for h in topology.hosts:
            doc["hosts"][h.name]["vars"] = {"serve_env": {"VLLM_CPU_OMP_THREADS_BIND": str((h.index - 1) % cores)}}
    return doc
