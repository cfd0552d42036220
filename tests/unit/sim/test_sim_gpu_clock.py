"""The emulated nvidia-smi's clock lock (issue 48): `-lgc` as root, `-rgc`, and `-q -d CLOCK` in the real tool's layout,
which (like the real tool) prints no locked range: a lock shows only as a current clock that stays under it. What
bootstrap's gpu.clock_cap reads (node/gpuclock.py) is read here from the emulator's own output."""

import json
import os
import shutil
import subprocess
import tempfile
from importlib import resources

import pytest

from sparkcluster.node.gpuclock import Clocks, parse_clock_report
from sparkcluster.sim.hardware import hardware_doc
from sparkcluster.sim.topology import Subnets, build_topology

HOST = resources.files("sparkcluster.sim") / "host"


@pytest.fixture
def gpu(tmp_path):
    """A host's hardware.json with the GPU under load (2405 MHz), and where its lock would be kept."""
    host = build_topology("lab", 1, Subnets(120), ["580.95.05"]).hosts[0]
    doc = hardware_doc("lab", host)
    doc["gpu"]["telemetry"] = {"sm_clock_mhz": 2405, "pstate": "P0", "clock_events": {"gpu_idle": False},
                               "clock_events_active": "0x0000000000000000"}
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(doc))
    return {"SPARKCLUSTER_SIM_HARDWARE": str(path), "SPARKCLUSTER_SIM_GPU_LOCK": str(tmp_path / "run" / "lock")}


def nvidia_smi(env, *args, user=None):
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if user == "nobody" else []
    return subprocess.run([*prefix, "/usr/bin/python3", str(HOST / "nvidia-smi"), *args], capture_output=True,
                          text=True, env=env)


def test_a_lock_caps_the_clock_every_reading_reports_until_reset(gpu):
    assert parse_clock_report(nvidia_smi(gpu, "-q", "-d", "CLOCK").stdout) == Clocks(2405, 3003)
    locked = nvidia_smi(gpu, "-lgc", "0,2000")
    assert locked.returncode == 0
    assert locked.stdout == 'GPU clocks set to "(gpuClkMin 0, gpuClkMax 2000)" for GPU 0000000F:01:00.0\n'
    report = nvidia_smi(gpu, "-q", "-d", "CLOCK").stdout
    assert parse_clock_report(report) == Clocks(2000, 3003)
    assert "Locked" not in report  # as the real tool: no getter for the range
    assert nvidia_smi(gpu, "--query-gpu=clocks.sm", "--format=csv,noheader").stdout == "2000 MHz\n"
    reset = nvidia_smi(gpu, "-rgc")
    assert (reset.returncode, reset.stdout) == (0, "All done.\n")
    assert parse_clock_report(nvidia_smi(gpu, "-q", "-d", "CLOCK").stdout) == Clocks(2405, 3003)


def test_the_clock_report_has_the_real_tools_sections_in_order(gpu):
    lines = nvidia_smi(gpu, "-q", "-d", "CLOCK").stdout.splitlines()
    sections = [line.strip() for line in lines if line.startswith("    ") and not line.startswith("        ")]
    assert sections == ["Clocks", "Applications Clocks", "Default Applications Clocks", "Deferred Clocks",
                        "Max Clocks", "Max Customer Boost Clocks", "Clock Policy"]
    assert "GPU 0000000F:01:00.0" in lines


def test_locking_takes_root_as_on_a_real_node(gpu):
    with tempfile.TemporaryDirectory(dir="/tmp") as shared:  # pytest's own folder is root's alone
        os.chmod(shared, 0o755)
        hardware = shutil.copy(gpu["SPARKCLUSTER_SIM_HARDWARE"], shared)
        os.chmod(hardware, 0o644)
        env = {**gpu, "SPARKCLUSTER_SIM_HARDWARE": hardware}
        denied = nvidia_smi(env, "-lgc", "0,2000", user="nobody")
        assert denied.returncode == 4 and "Insufficient Permissions" in denied.stdout
        assert parse_clock_report(nvidia_smi(env, "-q", "-d", "CLOCK").stdout).graphics == 2405
