"""`top`'s node view and its output: the probe line run for real in a shell (with the emulated GB10 nvidia-smi,
whose memory reads [N/A], and this machine's /proc/meminfo), parsed into a sample; a node that does not answer;
the rendered table and the JSON document; the flags checked before anything connects."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
from importlib import resources
from pathlib import Path

import pytest
from rich.console import Console

from sparkcluster.engine.errors import UsageError
from sparkcluster.engine.inventory import Host
from sparkcluster.node.gputelemetry import ClockEvent, GpuTelemetry
from sparkcluster.observe.nodeprobe import MemorySource, NodeSample, parse_probe, probe_command
from sparkcluster.observe.prometheus import parse
from sparkcluster.observe.scrape import Reading, figures
from sparkcluster.observe.top import EndpointView, TopSample, line, render, url_of
from sparkcluster.serving.runtime import RuntimeChoice
from sparkcluster.serving.top import alive_checks, interval
from sparkcluster.sim.hardware import hardware_doc
from sparkcluster.sim.topology import Subnets, build_topology

SIM_HOST = resources.files("sparkcluster.sim") / "host"
FIXTURES = Path(__file__).parents[2] / "fixtures" / "metrics"


@pytest.fixture
def gb10_path(tmp_path: Path) -> dict[str, str]:
    """PATH with the emulated GB10 nvidia-smi first, and the env it reads."""
    host = build_topology("lab", 1, Subnets(121), ["580.95.05"]).hosts[0]
    hw = tmp_path / "hardware.json"
    hw.write_text(json.dumps(hardware_doc("lab", host)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text((SIM_HOST / "nvidia-smi").read_text())
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SPARKCLUSTER_SIM_HARDWARE": str(hw),
            "HOME": str(tmp_path)}


def test_on_a_gb10_the_memory_is_the_nodes_unified_memory(gb10_path, tmp_path: Path):
    host = Host("spark-1", "10.0.0.1", role="head", vars={"python_env": "/v"})
    state = tmp_path / ".cache/sparkcluster/serve"
    state.mkdir(parents=True)
    (state / "main.pid").write_text(f"{os.getpid()}\n")  # a live pid: "main" runs; no vllm.pid: stopped
    command = probe_command(alive_checks(RuntimeChoice("host"), host, ["main", "vllm"]), "n0nce")
    out = subprocess.run(["sh", "-c", command.script], capture_output=True, text=True, env=gb10_path, check=True)
    sample = parse_probe("spark-1", out.stdout, "n0nce", ["main", "vllm"])
    assert sample.answered and sample.gpu_error is None and sample.gpu_util_pct == 0
    assert sample.memory_source is MemorySource.UNIFIED
    meminfo = dict(line.split(":") for line in Path("/proc/meminfo").read_text().splitlines())
    assert sample.memory_total_bytes == int(meminfo["MemTotal"].split()[0]) * 1024
    assert sample.memory_used_bytes is not None and 0 < sample.memory_used_bytes < sample.memory_total_bytes
    assert sample.processes == {"main": True, "vllm": False}
    # the same one nvidia-smi line reads the GB10's telemetry: its memory clock is not exposed
    assert sample.gpu == GpuTelemetry(41.0, 4.52, 208.0, None, (ClockEvent.GPU_IDLE,))
    assert sample.to_json()["gpu"] == {"temperature_c": 41.0, "power_w": 4.52, "sm_clock_mhz": 208.0,
                                       "mem_clock_mhz": None, "clock_events": ["gpu_idle"], "throttled_by": []}


def test_a_gpu_with_its_own_memory_and_a_missing_driver():
    own = parse_probe("n", "@x:gpu\n37, 1024, 81559, 55, 250.31, 1980, 2619, 0x0000000000000004\n@x:rc=0\n@x:mem\n"
                           "MemTotal: 100 kB\nMemAvailable: 50 kB\n", "x")
    assert own.memory_source is MemorySource.GPU and own.memory_used_bytes == 1024 * 2**20 and own.gpu_util_pct == 37
    assert own.gpu == GpuTelemetry(55.0, 250.31, 1980.0, 2619.0, (ClockEvent.SW_POWER_CAP,))
    gone = parse_probe("n", "@x:gpu\nsh: 1: nvidia-smi: not found\n@x:rc=127\n@x:mem\nMemTotal: 100 kB\n"
                            "MemAvailable: 40 kB\n", "x")
    assert gone.gpu_error == "sh: 1: nvidia-smi: not found" and gone.memory_used_bytes == 60 * 1024
    junk = parse_probe("n", "@x:gpu\n\x00garbage\n@x:rc=0\n@x:main\n", "x", ["main"])
    assert junk.gpu_error and junk.memory_used_bytes is None and junk.processes == {"main": False}
    assert gone.gpu is None and junk.gpu is None and gone.to_json()["gpu"] is None


def sample(nodes: list[NodeSample]) -> TopSample:
    busy = parse((FIXTURES / "vllm-0.32-cpu-busy.txt").read_text())
    later = parse((FIXTURES / "vllm-0.32-cpu-busy2.txt").read_text())
    return TopSample(0.0, EndpointView("http://h:8000/metrics", figures(later, Reading(1.0, busy), 1.5)), nodes)


def test_a_node_that_stops_answering_is_shown_as_such():
    nodes = [NodeSample("spark-1", gpu_util_pct=12, memory_used_bytes=40 * 2**30, memory_total_bytes=119 * 2**30,
                        memory_source=MemorySource.UNIFIED, processes={"main": True, "vllm": True},
                        gpu=GpuTelemetry(92, 95.03, 1534, None, (ClockEvent.HW_THERMAL_SLOWDOWN,))),
             NodeSample("spark-2", answered=False, error="no answer within 10 s")]
    top = sample(nodes)
    console = Console(width=160, record=True, color_system=None)
    console.print(render(top, 1.0))
    text = console.export_text()
    assert "not answering: no answer within 10 s" in text and "40.0 GiB / 119.0 GiB (unified)" in text
    assert "1,424.0" in text and "running" in text  # generation tok/s over the interval, Ray and vLLM state
    row = next(r for r in text.splitlines() if "spark-1" in r)
    assert all(cell in row for cell in ("92 C", "95.0 W", "1534 MHz", "hw_thermal_slowdown")), row
    assert "spark-1: GPU 12 %, 92 C, 95.0 W, SM 1534 MHz, throttled: hw_thermal_slowdown, memory 40.0 GiB" in line(top)
    doc = top.to_json()
    assert doc["nodes"]["spark-2"] == {"answered": False, "error": "no answer within 10 s"}
    assert doc["endpoint"]["figures"]["running"] == 8 and not top.complete
    assert "spark-2: not answering" in line(top)
    json.dumps(doc)


def test_a_failing_nvidia_smis_escape_sequences_never_reach_tops_table_or_json():
    """Round 6, F10: `top` printed `^[]0;PWNED^[[2JNVIDIA-SMI has failed^[[31m RED` in spark-2's row."""
    text = "@x:gpu\n\x1b]0;PWNED\x07\x1b[2JNVIDIA-SMI has failed\x1b[31m RED\n@x:rc=9\n@x:mem\nMemTotal: 100 kB\n"
    node = parse_probe("spark-2", text, "x", ["main"])
    assert node.gpu_error == "NVIDIA-SMI has failed RED", repr(node.gpu_error)  # c930bdd: the escapes kept
    console = Console(width=200, record=True, color_system=None)
    console.print(render(sample([node]), 1.0))
    shown = console.export_text()
    assert "nvidia-smi: NVIDIA-SMI has failed RED" in shown and "\x1b" not in shown and "\x07" not in shown
    assert "\\u001b" not in json.dumps(sample([node]).to_json()) and "\x07" not in line(sample([node]))


def test_an_endpoint_that_does_not_answer():
    top = TopSample(0.0, EndpointView("http://h:8000/metrics", error="/metrics did not answer: refused"), [])
    console = Console(width=120, record=True, color_system=None)
    console.print(render(top, 2.0))
    assert "did not answer" in console.export_text() and not top.complete


def test_flags_are_checked_before_anything_connects():
    assert interval("0.5") == 0.5
    for bad in ("0", "nan", "-1", "1e9", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            interval(bad)
    assert url_of("10.0.0.1:8000") == "http://10.0.0.1:8000/metrics"
    assert url_of("http://10.0.0.1:8000/v1/") == "http://10.0.0.1:8000/metrics"
    with pytest.raises(UsageError):
        url_of("ftp://x")
