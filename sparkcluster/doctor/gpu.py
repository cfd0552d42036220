"""The doctor's GPU findings: each node's telemetry (node/gputelemetry.py) read once, judged against what owners hit on
GB10 and the fixes that worked. A GPU at HOT_C or slowed by its hardware (thermal or not) fails, with the clock cap,
airflow and container shm size that stopped the hard power-offs; a power brake names the power brick; a software
thermal slowdown or power cap warns."""

from __future__ import annotations

from collections.abc import Mapping

from ..node.finding import Finding, Severity
from ..node.gputelemetry import HOT_C, ClockEvent, GpuTelemetry

GROUP = "gpu"
THERMAL_FIX = ("cap the GPU clock: `sudo nvidia-smi -lgc 0,2000` (about 10 C cooler at no speed loss; lifted by "
               "`sudo nvidia-smi -rgc` or a reboot); give the Spark air (vents clear, nothing stacked on or against "
               "it); for hard power-offs, a served container's shm_size at 10 GB (`--shm-size 10g`) instead of 64")
THERMAL_SOURCE = ("MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146 (`nvidia-smi -lgc 0,2000` stopped the "
                  "power-offs); tonyd2wild/DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark#31 (about 20 "
                  "power-offs with empty logs; shm_size 64 GB -> 10 GB)")
POWER_FIX = ("disconnect the power brick from the wall and from the Spark, wait 60 s, reconnect it (a fresh USB-C "
             "power negotiation); use the brick and cable that came with it")
POWER_SOURCE = ("hoesing/spark-gpu-throttle-check: a GB10 held near 500-850 MHz in P0 by its power delivery, "
                "cleared by a power-brick cycle")
HW_SLOWING = (ClockEvent.HW_THERMAL_SLOWDOWN, ClockEvent.HW_SLOWDOWN)


def findings(telemetry: Mapping[str, GpuTelemetry | str]) -> list[Finding]:
    found: list[Finding] = []
    for name, gpu in telemetry.items():
        if isinstance(gpu, str):
            found.append(Finding(GROUP, "telemetry", Severity.WARN, f"{name}: no GPU telemetry: {gpu}",
                                 "run `nvidia-smi` on the node; one that hangs or fails after an Xid needs a reboot",
                                 (name,)))
            continue
        found += _judged(name, gpu)
    return found


def _judged(name: str, gpu: GpuTelemetry) -> list[Finding]:
    figures = {name: gpu.summary()}
    hot = gpu.temperature_c is not None and gpu.temperature_c >= HOT_C
    slowed = [e for e in gpu.throttles if e in HW_SLOWING]
    out: list[Finding] = []
    if hot or slowed or ClockEvent.SW_THERMAL_SLOWDOWN in gpu.throttles:
        why = [f"at {gpu.temperature_c:.0f} C (>= {HOT_C} C)"] if hot and gpu.temperature_c is not None else []
        thermal = slowed + [e for e in gpu.throttles if e is ClockEvent.SW_THERMAL_SLOWDOWN]
        why += [f"clocks cut by {', '.join(thermal)}"] if thermal else []
        out.append(Finding(GROUP, "thermal", Severity.FAIL if hot or slowed else Severity.WARN,
                           f"{name}: GPU {' and '.join(why)} ({gpu.summary()})", THERMAL_FIX, (name,), figures,
                           THERMAL_SOURCE))
    if ClockEvent.HW_POWER_BRAKE_SLOWDOWN in gpu.throttles:
        out.append(Finding(GROUP, "power", Severity.FAIL,
                           f"{name}: GPU clocks cut by hw_power_brake_slowdown: its power supply braked it "
                           f"({gpu.summary()})", POWER_FIX, (name,), figures, POWER_SOURCE))
    elif ClockEvent.SW_POWER_CAP in gpu.throttles:
        out.append(Finding(GROUP, "power", Severity.WARN,
                           f"{name}: GPU held at its power cap (sw_power_cap; {gpu.summary()}); under load a GB10 "
                           "runs near 2400 MHz, and one held far below it has a power-delivery problem",
                           POWER_FIX, (name,), figures, POWER_SOURCE))
    if not out:
        out.append(Finding(GROUP, "telemetry", Severity.OK, f"{name}: {gpu.summary()}", nodes=(name,), values=figures))
    return out
