"""GPU telemetry read from nvidia-smi's CSV query in the shapes a GB10 prints: N/A and 0 clocks are unknown, never 0;
the clocks-event bitmask is named reason by reason; and the simulator's nvidia-smi prints what `sim hardware` gave it."""

from __future__ import annotations

import json
import subprocess
from importlib import resources
from pathlib import Path

from sparkcluster.node.gputelemetry import (
    EVENT_BITS,
    ClockEvent,
    GpuTelemetry,
    parse_output,
    parse_row,
    query_argv,
    telemetry_command,
)
from sparkcluster.sim.hardware import CLOCK_EVENTS, hardware_doc
from sparkcluster.sim.topology import Subnets, build_topology

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu"
HOST = resources.files("sparkcluster.sim") / "host"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_an_idle_gb10():
    t = parse_output(fixture("gb10-idle.csv") + "rc=0\n")
    assert t == GpuTelemetry(41.0, 4.52, 208.0, None, (ClockEvent.GPU_IDLE,))
    assert t.throttles == () and t.summary() == "41 C, 4.5 W, SM 208 MHz, not throttled"


def test_a_gb10_under_load_is_not_throttled():
    t = parse_output(fixture("gb10-load.csv") + "rc=0\n")
    assert isinstance(t, GpuTelemetry)
    assert (t.temperature_c, t.power_w, t.sm_clock_mhz, t.clock_events) == (71.0, 87.61, 2424.0, ())


def test_hw_thermal_slowdown_is_named():
    t = parse_output(fixture("gb10-hw-thermal.csv") + "rc=0\n")
    assert isinstance(t, GpuTelemetry)
    assert t.throttles == (ClockEvent.HW_THERMAL_SLOWDOWN,)
    assert t.summary() == "92 C, 95.0 W, SM 1534 MHz, throttled: hw_thermal_slowdown"
    assert t.to_json()["throttled_by"] == ["hw_thermal_slowdown"]


def test_a_zero_memory_clock_is_unknown_and_the_power_cap_is_a_throttle():
    t = parse_row(fixture("gb10-power-capped-mem-clock-zero.csv").strip())
    assert t is not None and t.mem_clock_mhz is None and t.sm_clock_mhz == 507.0
    assert t.throttles == (ClockEvent.SW_POWER_CAP,)


def test_fields_a_gb10_does_not_report_are_unknown_never_zero():
    t = parse_row(fixture("gb10-not-supported.csv").strip())
    assert t == GpuTelemetry(40.0, None, 208.0, None, None)
    assert t.summary() == "40 C, ? W, SM 208 MHz"
    assert t.to_json() == {"temperature_c": 40.0, "power_w": None, "sm_clock_mhz": 208.0, "mem_clock_mhz": None,
                           "clock_events": None, "throttled_by": []}


def test_units_and_several_reasons():
    t = parse_row(fixture("gb10-with-units.csv").strip())
    assert t is not None and (t.power_w, t.sm_clock_mhz) == (95.03, 1534.0)
    assert t.throttles == (ClockEvent.HW_SLOWDOWN, ClockEvent.HW_THERMAL_SLOWDOWN, ClockEvent.HW_POWER_BRAKE_SLOWDOWN)


def test_figures_no_gpu_can_report_are_unknown_not_shown():
    """Round 6 T9: `1e308, -500, 99999999999999999999` were taken as 1e308 C, -500 W and a 1e20 MHz clock."""
    t = parse_row("1e308, -500, 99999999999999999999, 0, 0x0000000000000001")
    assert t == GpuTelemetry(None, None, None, None, (ClockEvent.GPU_IDLE,))
    assert t.summary() == "? C, ? W, SM ? MHz, not throttled"
    edge = parse_row("-5, 0, 3000, 0, 0x0")
    assert edge is not None and (edge.temperature_c, edge.power_w, edge.sm_clock_mhz) == (-5.0, 0.0, 3000.0)


def test_failures_are_nvidia_smis_words():
    assert parse_output(fixture("driver-gone.txt") + "rc=9\n").startswith("NVIDIA-SMI has failed because")
    assert parse_output("rc=124\n") == "nvidia-smi gave no answer within 5 s (a hung GPU driver?)"
    assert parse_output("41, 4.52\nrc=0\n") == "nvidia-smi printed '41, 4.52'"
    assert parse_row("garbage") is None


# Round 6, F10: a wrapped nvidia-smi on spark-2 printing a title change, a screen clear and a colour around its words.
HOSTILE_SMI = "\x1b]0;PWNED\x07\x1b[2JNVIDIA-SMI has failed\x1b[31m RED\n"


def test_nvidia_smis_words_are_printable_where_they_are_parsed():
    said = parse_output(HOSTILE_SMI + "rc=9\n")  # c930bdd: the escapes and the BEL, as printed
    assert said == "NVIDIA-SMI has failed RED", repr(said)
    assert parse_output("\x1b[2J\x07\nrc=9\n") == "nvidia-smi exited 9"  # nothing printable left: its exit code


def test_the_command_bounds_nvidia_smi_on_the_node(tmp_path):
    script = telemetry_command().script
    assert "timeout -k 1 5 nvidia-smi --query-gpu=temperature.gpu,power.draw,clocks.sm,clocks.mem," in script
    assert "head -c 4096" in script
    flood = tmp_path / "nvidia-smi"  # a broken nvidia-smi that prints without end
    flood.write_text("#!/bin/sh\nyes 0123456789\n")
    flood.chmod(0o755)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert len(out.stdout) < 4200 and out.stdout.endswith("rc=141\n")  # cut at 4096 bytes: SIGPIPE ended it
    assert parse_output(out.stdout).startswith("nvidia-smi printed more than 4096 bytes: '0123456789 0123")
    hung = tmp_path / "nvidia-smi"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert parse_output(out.stdout) == "nvidia-smi gave no answer within 5 s (a hung GPU driver?)"


def test_the_simulator_names_the_reasons_as_nvml_does():
    assert CLOCK_EVENTS == {str(event): bit for event, bit in EVENT_BITS.items()}


def emulated(settings, tmp_path) -> GpuTelemetry | str:
    host = build_topology("lab", 2, Subnets(120), ["580.95.05"]).hosts[1]
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(hardware_doc("lab", host, settings)))
    argv = ["/usr/bin/python3", str(HOST / "nvidia-smi"), *query_argv().split()[1:]]
    out = subprocess.run(argv, capture_output=True, text=True, env={"SPARKCLUSTER_SIM_HARDWARE": str(path)})
    return parse_output(f"{out.stdout}rc={out.returncode}\n")


def test_the_emulated_nvidia_smi_reports_what_sim_hardware_gave(tmp_path):
    assert emulated({}, tmp_path) == GpuTelemetry(41.0, 4.52, 208.0, None, (ClockEvent.GPU_IDLE,))
    hot = emulated({"gpu_temp_c": 92, "power_w": 95.0, "sm_clock_mhz": 1534, "throttle": ["hw_thermal_slowdown"]},
                   tmp_path)
    assert hot == GpuTelemetry(92.0, 95.0, 1534.0, None, (ClockEvent.HW_THERMAL_SLOWDOWN,))
