"""The doctor's GPU findings from telemetry in the shapes a GB10 prints: a hot or hardware-slowed GPU fails with the
clock cap, airflow and shm size owners found; a power brake names the power brick; an idle GPU passes with its figures."""

from __future__ import annotations

from pathlib import Path

from sparkcluster.doctor.gpu import findings
from sparkcluster.node.finding import Severity
from sparkcluster.node.gputelemetry import ClockEvent, GpuTelemetry, parse_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu"


def read(name: str) -> GpuTelemetry | str:
    return parse_output((FIXTURES / name).read_text() + ("rc=9\n" if name.endswith(".txt") else "rc=0\n"))


def test_a_hot_gpu_throttled_by_the_hardware_fails_on_its_node_with_the_fixes_owners_found():
    found = findings({"spark-1": read("gb10-idle.csv"), "spark-2": read("gb10-hw-thermal.csv")})
    bad = [f for f in found if f.severity is not Severity.OK]
    assert [(f.check, f.severity, f.nodes) for f in bad] == [("thermal", Severity.FAIL, ("spark-2",))]
    assert bad[0].summary == ("spark-2: GPU at 92 C (>= 90 C) and clocks cut by hw_thermal_slowdown "
                              "(92 C, 95.0 W, SM 1534 MHz, throttled: hw_thermal_slowdown)")
    assert "`sudo nvidia-smi -lgc 0,2000`" in bad[0].fix and "air" in bad[0].fix and "10 GB" in bad[0].fix
    assert "#146" in bad[0].source and "#31" in bad[0].source
    ok = [f for f in found if f.severity is Severity.OK]
    assert [(f.nodes, f.summary) for f in ok] == [(("spark-1",), "spark-1: 41 C, 4.5 W, SM 208 MHz, not throttled")]


def test_heat_alone_fails_and_a_software_thermal_slowdown_alone_warns():
    hot = findings({"n": GpuTelemetry(90, 60, 2400, None, ())})
    assert [(f.check, f.severity) for f in hot] == [("thermal", Severity.FAIL)]
    warm = findings({"n": GpuTelemetry(84, 60, 1900, None, (ClockEvent.SW_THERMAL_SLOWDOWN,))})
    assert [(f.check, f.severity) for f in warm] == [("thermal", Severity.WARN)]
    assert "clocks cut by sw_thermal_slowdown" in warm[0].summary


def test_a_power_brake_names_the_power_brick_and_a_power_cap_warns():
    brake = findings({"n": read("gb10-with-units.csv")})  # hw_slowdown, hw_thermal_slowdown and hw_power_brake
    assert [(f.check, f.severity) for f in brake] == [("thermal", Severity.FAIL), ("power", Severity.FAIL)]
    assert "wait 60 s" in brake[1].fix
    capped = findings({"n": read("gb10-power-capped-mem-clock-zero.csv")})
    assert [(f.check, f.severity) for f in capped] == [("power", Severity.WARN)]


def test_unknown_figures_are_not_judged_and_a_failed_query_warns():
    unknown = findings({"n": read("gb10-not-supported.csv")})
    assert [(f.check, f.severity) for f in unknown] == [("telemetry", Severity.OK)]
    gone = findings({"n": read("driver-gone.txt")})
    assert [(f.check, f.severity) for f in gone] == [("telemetry", Severity.WARN)]
    assert "NVIDIA-SMI has failed" in gone[0].summary


def test_the_gpu_group_shows_every_nodes_figures_and_the_fix_where_one_fails():
    from rich.console import Console

    from sparkcluster.doctor.render import render
    from sparkcluster.doctor.run import DoctorReport

    telemetry = {"spark-1": read("gb10-idle.csv"), "spark-2": read("gb10-hw-thermal.csv")}
    console = Console(width=400, record=True, color_system=None)
    render(console, DoctorReport("", {}, {}, tuple(findings(telemetry)), gpu=telemetry))
    lines = console.export_text().splitlines()
    at = lines.index("gpu")
    assert lines[at + 1] == "  ok   telemetry: spark-1: 41 C, 4.5 W, SM 208 MHz, not throttled"
    assert lines[at + 2].startswith("  FAIL thermal: spark-2: GPU at 92 C (>= 90 C) and clocks cut by hw_thermal_slowdown")
    assert lines[at + 3].startswith("         fix: cap the GPU clock: `sudo nvidia-smi -lgc 0,2000`")
    assert lines[at + 4].startswith("         reported: MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146")
    assert lines[-1] == "doctor: problems found: 1 failed, 0 warnings, 0 nodes checked"
