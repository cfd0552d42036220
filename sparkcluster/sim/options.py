"""What `sim up` is asked for (UpOptions, with its defaults), checked whole before anything is created."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..engine.errors import UsageError
from .inventory import CPU_RAY_PLUGIN, has_cpu_ray_plugin
from .shaping import tc_rate
from .topology import Subnets, build_topology

DEFAULT_NAME = "sim"
DEFAULT_DRIVER = "590.48.01"
# About 1/20 of what one TCP stream gets across a fabric veth here (~1.5 GB/s), as 10 GbE is to the 200 Gb/s
# QSFP link; low enough that even CPU-bound SSH streams stay >10x faster on the fabric.
DEFAULT_LAN_RATE = "500mbit"
DEFAULT_USER = "spark"
DEFAULT_UID = 1500


@dataclass(frozen=True)
class UpOptions:
    count: int
    name: str = DEFAULT_NAME
    drivers: tuple[str, ...] = (DEFAULT_DRIVER,)
    port0_hosts: frozenset[str] = frozenset()
    docker: bool = True
    lan_rate: str = DEFAULT_LAN_RATE
    user: str = DEFAULT_USER
    ssh_mesh: bool = True
    vllm_env: str | None = None
    fabric_addresses: bool = True
    rdma_names: str = "roce"
    link_local: bool = False  # implies no fabric addresses: bootstrap replaces the link-local ones
    topology: str = "switch"
    miscable: str = ""


def validate(opts: UpOptions) -> None:
    if not opts.name.replace("-", "").isalnum() or len(opts.name) > 20:
        raise UsageError(f"invalid cluster name {opts.name!r}", "use up to 20 letters, digits and dashes")
    for driver in opts.drivers:
        parts = driver.split(".")
        if not (2 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
            raise UsageError(f"invalid driver version {driver!r}", "give it as nvidia-smi prints it, e.g. 580.95.05 or 590.44")
    if not tc_rate(opts.lan_rate):
        raise UsageError(f"invalid LAN rate {opts.lan_rate!r}", "give a tc rate such as 750mbit or 1gbit")
    if opts.vllm_env and not os.access(os.path.join(opts.vllm_env, "bin", "vllm"), os.X_OK):
        raise UsageError(f"{opts.vllm_env} holds no vllm (bin/vllm)", "build it with scripts/setup-vllm.sh")
    if opts.vllm_env and not has_cpu_ray_plugin(opts.vllm_env):
        raise UsageError(f"{opts.vllm_env} holds no {CPU_RAY_PLUGIN}: without it the CPU vLLM cannot run under "
                         "Ray, serve's default launcher, across the simulated hosts",
                         "build the environment with scripts/setup-vllm.sh, which installs it")
    try:
        build_topology(opts.name, opts.count, Subnets(100), list(opts.drivers), opts.port0_hosts, opts.rdma_names,
                       opts.topology, opts.miscable)
    except ValueError as e:
        raise UsageError(str(e)) from None
