"""A GPU's live telemetry: temperature, power draw, SM and memory clocks, and the clocks-event (throttle) reasons,
read with one nvidia-smi query in the CSV form a GB10 prints, e.g. (idle, driver 580):

    $ nvidia-smi --query-gpu=temperature.gpu,power.draw,clocks.sm,clocks.mem,clocks_event_reasons.active \\
        --format=csv,noheader,nounits
    41, 4.52, 208, [N/A], 0x0000000000000001

The GB10 has no memory of its own: fields it does not expose read "[N/A]" or "[Not Supported]" (and the memory
clock, which NVML does not expose there, may read 0). Each is unknown (None), never 0. The reasons are NVML's
clocks-event bitmask (nvmlClocksEventReason*), named as nvidia-smi names its per-reason fields.

Read by doctor (its findings), top (a column per figure, `--json` per node) and bench (the nodes at the end).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..engine.command import Command
from ..engine.inventory import Host
from ..engine.nodetext import printable
from ..engine.session import Session
from ..engine.transport import Unreachable

TELEMETRY_FIELDS = ("temperature.gpu", "power.draw", "clocks.sm", "clocks.mem", "clocks_event_reasons.active")
TELEMETRY_FORMAT = "csv,noheader,nounits"
TELEMETRY_DEADLINE_S = 5  # nvidia-smi hangs with a wedged driver: the query ends there, on the node
TELEMETRY_OUTPUT_LIMIT = 4096  # a broken nvidia-smi's flood is cut here
HOT_C = 90  # a GPU at or above this is named hot (doctor fails it, top shows it red)
UNKNOWN = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "[Insufficient Permissions]", "")


class ClockEvent(StrEnum):
    """Why the GPU's clocks are where they are: nvidia-smi's `clocks_event_reasons.<name>`."""

    GPU_IDLE = "gpu_idle"
    APPLICATIONS_CLOCKS_SETTING = "applications_clocks_setting"
    SW_POWER_CAP = "sw_power_cap"
    HW_SLOWDOWN = "hw_slowdown"
    SYNC_BOOST = "sync_boost"
    SW_THERMAL_SLOWDOWN = "sw_thermal_slowdown"
    HW_THERMAL_SLOWDOWN = "hw_thermal_slowdown"
    HW_POWER_BRAKE_SLOWDOWN = "hw_power_brake_slowdown"
    DISPLAY_CLOCK_SETTING = "display_clock_setting"


# NVML's bit for each reason (nvml.h, nvmlClocksEventReason*).
EVENT_BITS: dict[ClockEvent, int] = {
    ClockEvent.GPU_IDLE: 0x1, ClockEvent.APPLICATIONS_CLOCKS_SETTING: 0x2, ClockEvent.SW_POWER_CAP: 0x4,
    ClockEvent.HW_SLOWDOWN: 0x8, ClockEvent.SYNC_BOOST: 0x10, ClockEvent.SW_THERMAL_SLOWDOWN: 0x20,
    ClockEvent.HW_THERMAL_SLOWDOWN: 0x40, ClockEvent.HW_POWER_BRAKE_SLOWDOWN: 0x80,
    ClockEvent.DISPLAY_CLOCK_SETTING: 0x100,
}
# The reasons that mean the GPU is being slowed against the load's will (idle, a set clock, a display are not).
THROTTLES = (ClockEvent.SW_POWER_CAP, ClockEvent.HW_SLOWDOWN, ClockEvent.SW_THERMAL_SLOWDOWN,
             ClockEvent.HW_THERMAL_SLOWDOWN, ClockEvent.HW_POWER_BRAKE_SLOWDOWN)


@dataclass(frozen=True)
class GpuTelemetry:
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    clock_events: tuple[ClockEvent, ...] | None = None  # None: not reported

    @property
    def throttles(self) -> tuple[ClockEvent, ...]:
        return tuple(e for e in self.clock_events or () if e in THROTTLES)

    def to_json(self) -> dict[str, Any]:
        return {"temperature_c": self.temperature_c, "power_w": self.power_w, "sm_clock_mhz": self.sm_clock_mhz,
                "mem_clock_mhz": self.mem_clock_mhz,
                "clock_events": None if self.clock_events is None else [str(e) for e in self.clock_events],
                "throttled_by": [str(e) for e in self.throttles]}

    def summary(self) -> str:
        """e.g. `92 C, 87.2 W, SM 2424 MHz, throttled: hw_thermal_slowdown` (`?` for what the GPU did not report)."""
        parts = [f"{_figure(self.temperature_c, '{:.0f}')} C", f"{_figure(self.power_w, '{:.1f}')} W",
                 f"SM {_figure(self.sm_clock_mhz, '{:.0f}')} MHz"]
        if self.throttles:
            parts.append(f"throttled: {', '.join(self.throttles)}")
        elif self.clock_events is not None:
            parts.append("not throttled")
        return ", ".join(parts)


def telemetry_json(got: GpuTelemetry | str) -> dict[str, Any]:
    """A node's telemetry in a JSON document, or `{"error": why}` where nvidia-smi gave none."""
    return {"error": got} if isinstance(got, str) else got.to_json()


def _figure(value: float | None, fmt: str) -> str:
    return "?" if value is None else fmt.format(value)


def query_argv(fields: Sequence[str] = TELEMETRY_FIELDS) -> str:
    return f"nvidia-smi --query-gpu={','.join(fields)} --format={TELEMETRY_FORMAT}"


def telemetry_command(timeout: float = TELEMETRY_DEADLINE_S + 5) -> Command:
    """The query alone, bounded on the node in time and bytes (a flood ends nvidia-smi with SIGPIPE); its exit code
    follows as a last line `rc=N`."""
    script = (f"s=$(mktemp) || exit 1; {{ timeout -k 1 {TELEMETRY_DEADLINE_S} {query_argv()} 2>&1; echo $? > \"$s\"; }}"
              f" | head -c {TELEMETRY_OUTPUT_LIMIT} | tr -d '\\000'; echo; echo \"rc=$(cat \"$s\")\"; rm -f \"$s\"")
    return Command(script, timeout=timeout)


def parse_number(word: str) -> float | None:
    """A figure as nvidia-smi prints it ("41", "4.52", "4.52 W", "208 MHz"); unknown for N/A and the like."""
    word = word.strip()
    if word in UNKNOWN:
        return None
    try:
        value = float(word.split()[0])
    except (ValueError, IndexError):
        return None
    return value if math.isfinite(value) else None


def parse_clock_events(word: str) -> tuple[ClockEvent, ...] | None:
    """`0x0000000000000041` -> (gpu_idle, hw_thermal_slowdown); bits NVML may add later are left out."""
    word = word.strip()
    if word in UNKNOWN:
        return None
    try:
        mask = int(word, 16)
    except ValueError:
        return None
    return tuple(event for event, bit in EVENT_BITS.items() if mask & bit)


# What a GPU can report at all, per figure: outside it a value is a broken or forged reading (round 6 T9: 1e308 C,
# -500 W, 1e20 MHz were shown as figures), so it is unknown rather than a number that alarms or reassures.
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "temperature.gpu": (-40.0, 200.0), "power.draw": (0.0, 5000.0), "clocks.sm": (0.0, 10000.0),
    "clocks.mem": (0.0, 50000.0),
}


def _figure_of(values: Mapping[str, str], name: str) -> float | None:
    value = parse_number(values.get(name, ""))
    low, high = PLAUSIBLE[name]
    return value if value is not None and low <= value <= high else None


def from_values(values: Mapping[str, str]) -> GpuTelemetry:
    """Query field name -> the word nvidia-smi printed for it; fields not asked for, or out of any GPU's range,
    are unknown."""
    return GpuTelemetry(
        temperature_c=_figure_of(values, "temperature.gpu"),
        power_w=_figure_of(values, "power.draw"),
        # No GPU runs at 0 MHz: a 0 is a clock the driver does not expose (GB10's memory clock).
        sm_clock_mhz=_figure_of(values, "clocks.sm") or None,
        mem_clock_mhz=_figure_of(values, "clocks.mem") or None,
        clock_events=parse_clock_events(values.get("clocks_event_reasons.active", "")),
    )


def parse_row(row: str, fields: Sequence[str] = TELEMETRY_FIELDS) -> GpuTelemetry | None:
    """One CSV row of the query; None where it is not a row of those fields."""
    words = [w.strip() for w in row.split(",")]
    if len(words) != len(fields):
        return None
    return from_values(dict(zip(fields, words)))


def failure_words(rows: Sequence[str], rc: str) -> str:
    """Why nvidia-smi gave no telemetry, in its own words, made printable here where they are read: a wrapped or
    broken nvidia-smi's escape sequences (`ESC]0;title BEL`, `ESC[2J`) would otherwise retitle and clear the
    terminal of whoever reads `top`, `doctor` or a JSON document. Its exit code where it said nothing."""
    return printable(" ".join(rows)).strip()[:200] or f"nvidia-smi exited {rc or '?'}"


def parse_output(text: str) -> GpuTelemetry | str:
    """What telemetry_command printed: the telemetry, or why there is none (nvidia-smi's own words)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    rc = next((line[3:] for line in reversed(lines) if line.startswith("rc=")), "")
    rows = [line for line in lines if not line.startswith("rc=")]
    if rc in ("124", "137"):
        return f"nvidia-smi gave no answer within {TELEMETRY_DEADLINE_S} s (a hung GPU driver?)"
    if rc == "141":
        return f"nvidia-smi printed more than {TELEMETRY_OUTPUT_LIMIT} bytes: {' '.join(rows)[:100]!r}"
    if rc != "0" or not rows:
        return failure_words(rows, rc)
    return parse_row(rows[0]) or f"nvidia-smi printed {rows[0][:100]!r}"


def read(session: Session, host: Host) -> GpuTelemetry | str:
    """One node's telemetry, or why there is none (a node gone since it was connected among the reasons)."""
    try:
        result = session.run(host, telemetry_command())
    except Unreachable as e:
        return e.message
    if result.timed_out:
        return f"the GPU telemetry query timed out after {result.command.timeout:g} s"
    return parse_output(result.stdout)


def read_all(session: Session, hosts: Sequence[Host]) -> dict[str, GpuTelemetry | str]:
    """Every node's telemetry, read in parallel, each in its own bounded query."""
    return {host.name: got for host, got in zip(hosts, session.each(lambda h: read(session, h), list(hosts)))}
