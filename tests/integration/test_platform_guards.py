"""Issue 48's platform guards on simulated Sparks: bootstrap's GPU clock cap converges through a real SSH session,
sudo and the emulated nvidia-smi (locked, put back by its unit at the next boot, re-applied once reset by hand) and a
second run changes nothing; `doctor --upgrades` reads every node's real apt simulation (the hosts share this Debian machine's root
filesystem) and says that fwupd is not there to read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sparkcluster.node.gpuclock import MARK_PATH, UNIT_PATH, WANTS_LINK
from tests.support.helpers import run_cli, ssh

pytestmark = pytest.mark.sim

PLAYBOOK = """
name: gpu-clock
plays:
  - name: gpu clock
    hosts: all
    gather_facts: false
    steps:
      - gpu.clock_cap: {cap_mhz: "{{ gpu_clock_cap | default(0) }}"}
"""


def alone(cluster, host: str, tmp_path: Path) -> Path:
    """The cluster's inventory with `host` alone, as its head (the step is per node: no other node is touched)."""
    doc = yaml.safe_load(cluster.inventory_path.read_text())
    doc["hosts"] = {host: {**doc["hosts"][host], "role": "head"}}
    path = tmp_path / "alone.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def clock_cap(inventory: Path, playbook: Path) -> dict:
    out = run_cli("run", str(playbook), "-i", str(inventory), "-e", "gpu_clock_cap=2000", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    (step,) = [s for s in json.loads(out.stdout)["steps"] if s["step"] == "gpu.clock_cap"]
    return step


def test_the_clock_cap_is_applied_kept_at_boot_and_reapplied_once_reset(cluster, fresh_host, tmp_path):
    playbook = tmp_path / "pb.yml"
    playbook.write_text(PLAYBOOK)
    inventory = alone(cluster, fresh_host, tmp_path)
    cluster.set_hardware(fresh_host, {"sm_clock_mhz": 2405})  # under load
    try:
        first = clock_cap(inventory, playbook)
        assert first["status"] == "changed", first
        assert first["reason"] == (f"create {UNIT_PATH}; enable sparkcluster-gpu-clock.service at boot; cap the GPU "
                                   "clock at 2000 MHz now (no cap applied since boot)")
        smi = ssh(cluster, fresh_host, "nvidia-smi --query-gpu=clocks.sm --format=csv,noheader").stdout
        assert smi == "2000 MHz\n"  # the emulated GPU runs under its lock
        assert ssh(cluster, fresh_host, f"readlink {WANTS_LINK}").stdout == f"{UNIT_PATH}\n"
        unit = ssh(cluster, fresh_host, f"stat -c '%U %a' {UNIT_PATH} && cat {UNIT_PATH}").stdout
        assert unit.startswith("root 644\n") and "ExecStart=/bin/sh -c 'nvidia-smi -lgc 0,2000 && " in unit
        assert ssh(cluster, fresh_host, f"cat {MARK_PATH}").stdout == "0,2000\n"

        again = clock_cap(inventory, playbook)
        assert (again["status"], again["reason"]) == (
            "ok", "GPU clock capped at 2000 MHz (graphics clock 2000 MHz); sparkcluster-gpu-clock.service re-applies "
                  "it at boot")

        # a power cycle forgets the lock (the GPU and /run start afresh): the unit enabled at boot puts it back,
        # with no command from here (the simulator's boot starts enabled units as systemd does)
        cluster.power_off(fresh_host)
        cluster.boot(fresh_host)
        smi = ssh(cluster, fresh_host, "nvidia-smi --query-gpu=clocks.sm --format=csv,noheader").stdout
        assert smi == "2000 MHz\n"
        assert ssh(cluster, fresh_host, f"cat {MARK_PATH}").stdout == "0,2000\n"
        assert clock_cap(inventory, playbook)["status"] == "ok"

        ssh(cluster, fresh_host, "nvidia-smi -rgc", user="root")  # someone lifts the lock by hand
        reset = clock_cap(inventory, playbook)
        assert reset["status"] == "changed" and reset["reason"] == (
            "cap the GPU clock at 2000 MHz again (graphics clock 2405 MHz, above the cap: the lock was reset)")
        assert clock_cap(inventory, playbook)["status"] == "ok"
    finally:
        cluster.set_hardware(fresh_host, {"sm_clock_mhz": None})


def test_doctor_upgrades_reads_every_nodes_apt_and_names_what_it_cannot_read(cluster):
    out = run_cli("doctor", "-i", str(cluster.inventory_path), "--upgrades", "--json", timeout=300)
    doc = json.loads(out.stdout)
    nodes = doc["upgrades"]["nodes"]
    assert list(nodes) == ["spark-1", "spark-2", "spark-3"], out.stderr
    for name, node in nodes.items():
        # this Debian machine's packages hold no kernel image or NVIDIA driver: nothing to hold back
        assert all(not c["held_back_by"] for c in node["candidates"]), node
        assert node["unread"] == ["fwupdmgr is not installed: firmware and BIOS updates not read"], node
    upgrades = [f for f in doc["findings"] if f["group"] == "upgrades"]
    assert {f["severity"] for f in upgrades} == {"ok", "warn"}
    assert sum(f["summary"].endswith("none on the known-bad table") for f in upgrades) == 3
