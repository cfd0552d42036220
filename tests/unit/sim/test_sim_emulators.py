"""The emulated hardware tools print exactly the shapes captured on real Sparks (tests/fixtures/probe-spark.txt)."""

import json
import subprocess
from importlib import resources

import pytest

from sparkcluster.sim.hardware import hardware_doc
from sparkcluster.sim.topology import Subnets, build_topology

HOST = resources.files("sparkcluster.sim") / "host"


@pytest.fixture
def hardware(tmp_path):
    host = build_topology("lab", 1, Subnets(120), ["580.95.05"]).hosts[0]
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(hardware_doc("lab", host)))
    return path


def nvidia_smi(hardware, *args):
    return subprocess.run(["/usr/bin/python3", str(HOST / "nvidia-smi"), *args], capture_output=True, text=True,
                          env={"SPARKCLUSTER_SIM_HARDWARE": str(hardware)})


def test_query_with_header(hardware):
    out = nvidia_smi(hardware, "--query-gpu=name,driver_version", "--format=csv")
    assert out.returncode == 0
    assert out.stdout == "name, driver_version\nNVIDIA GB10, 580.95.05\n"


def test_unified_memory_reads_not_available(hardware):
    out = nvidia_smi(hardware, "--query-gpu=name,driver_version,memory.total", "--format=csv")
    assert out.stdout == "name, driver_version, memory.total [MiB]\nNVIDIA GB10, 580.95.05, [N/A]\n"


def test_noheader_and_compute_cap(hardware):
    out = nvidia_smi(hardware, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader")
    assert out.stdout == "NVIDIA GB10, 580.95.05, 12.1\n"


def test_nounits_drops_the_unit_from_the_header(hardware):
    out = nvidia_smi(hardware, "--query-gpu=memory.total", "--format=csv,nounits")
    assert out.stdout == "memory.total\n[N/A]\n"


def test_list_gpus(hardware):
    out = nvidia_smi(hardware, "-L")
    assert out.stdout.startswith("GPU 0: NVIDIA GB10 (UUID: GPU-")


def test_unknown_field_fails_like_the_real_tool(hardware):
    out = nvidia_smi(hardware, "--query-gpu=bogus", "--format=csv")
    assert out.returncode == 2
    assert 'Field "bogus" is not a valid field to query.' in out.stdout


def test_summary_names_driver_and_cuda(hardware):
    out = nvidia_smi(hardware)
    assert "Driver Version: 580.95.05" in out.stdout and "CUDA Version: 13.0" in out.stdout
    assert "NVIDIA GB10" in out.stdout
