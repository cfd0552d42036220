"""`sim up --vllm-env` (issue 43): the inventory it writes sets what the CPU vLLM needs to serve with the default
launcher, Ray, across the simulated hosts (the simulator's own platform plugin, switched on in serve_env, which
reaches every vLLM process and Ray's workers); an environment without that plugin is refused before anything starts,
naming it and how to build one that has it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkcluster.engine.errors import UsageError
from sparkcluster.engine.inventory import load_inventory
from sparkcluster.serving.nodes import node_env
from sparkcluster.sim import SimCluster, UpOptions
from sparkcluster.sim.options import validate as _validate
from sparkcluster.sim.inventory import CPU_RAY_PLUGIN, CPU_RAY_SWITCH
from sparkcluster.sim.state import ClusterState


def vllm_env(root: Path, plugin: bool) -> Path:
    """A virtual environment's shape: bin/vllm, and the plugin's dist-info where asked."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "vllm").write_text("#!/bin/sh\n")
    (root / "bin" / "vllm").chmod(0o755)
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if plugin:
        (site / f"{CPU_RAY_PLUGIN}-0.1.0.dist-info").mkdir()
    return root


def test_the_inventory_turns_the_cpu_ray_plugin_on_for_every_serving_process(tmp_path, monkeypatch):
    """Failed before: only the tests' fixture set it, so `serve --tp 2` with the default launcher on a --vllm-env
    pair failed with `ValueError: current platform cpu does not support ray.`"""
    monkeypatch.setenv("SPARKCLUSTER_SIM_ROOT", str(tmp_path / "sim"))
    env = vllm_env(tmp_path / "venv", plugin=True)
    state = ClusterState(name="lab43", count=2, k=120, drivers=["590.48.01"], port0_hosts=[], docker=False,
                         lan_rate="500mbit", user="spark", uid=1500, ssh_mesh=True, vllm_env=str(env))
    cluster = SimCluster(state)
    state.dir.mkdir(parents=True)
    cluster.client_key.write_text("key")
    cluster.known_hosts.write_text("hosts")
    cluster.write_inventory()
    assert yaml.safe_load(cluster.inventory_path.read_text())["vars"]["serve_env"][CPU_RAY_SWITCH] == "1"
    inventory = load_inventory(cluster.inventory_path)
    for host in inventory.hosts:  # what serve gives Ray's start and vLLM's on each node
        assert node_env(inventory, host).env[CPU_RAY_SWITCH] == "1"


def test_a_vllm_env_without_the_plugin_is_refused_before_anything_starts(tmp_path):
    _validate(UpOptions(count=2, name="lab43", vllm_env=str(vllm_env(tmp_path / "good", plugin=True))))
    with pytest.raises(UsageError) as refused:
        _validate(UpOptions(count=2, name="lab43", vllm_env=str(vllm_env(tmp_path / "bare", plugin=False))))
    assert refused.value.exit_code == 2
    assert CPU_RAY_PLUGIN in refused.value.message and "Ray, serve's default launcher" in refused.value.message
    assert refused.value.fix == "build the environment with scripts/setup-vllm.sh, which installs it"
