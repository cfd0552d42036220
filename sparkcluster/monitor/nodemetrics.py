"""A node's values as Prometheus families: each function renders one value sparkcluster already reads (GPU
telemetry, meminfo, the kernel log, the QSFP twins, the HF cache's disk, the last verify, the supervisor's files).
Pure: the values come in, families go out; collect.py reads them on the node.

Names carry base units (bytes, seconds, celsius, watts, hertz; link speeds in megabits a second, as sysfs and
the issue state them). A figure that is unknown is absent, never 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ..nccl.lastverify import LAST_VERIFY_PATH
from ..node.gputelemetry import EVENT_BITS, THROTTLES, GpuTelemetry
from ..node.kernellog import KernelLog
from ..node.network import FULL_SPEED_MBPS
from ..serving.incidents import Seen, WatchState
from .exposition import Family
from .qsfp import CONGESTION, DATA_WORDS, ERRORS, PACKETS, QsfpTwin
from .supervisorfiles import SupervisorFiles, epoch_seconds

# Every kind the kernel-log reader names, each always rendered (0 until it happens), so that a first Xid is an
# increase Prometheus can see rather than a new series.
KERNEL_KINDS = ("xid", "nv-no-memory", "mlx5-timeout", "link-down", "link-up", "aer", "oom-kill")


def gpu_families(got: GpuTelemetry | str) -> list[Family]:
    up = Family("sparkcluster_gpu_telemetry_up", "1 where nvidia-smi answered the telemetry query, 0 where not")
    up.add(0 if isinstance(got, str) else 1)
    if isinstance(got, str):
        return [up]
    temp = Family("sparkcluster_gpu_temperature_celsius", "GPU temperature (nvidia-smi temperature.gpu)")
    temp.add(got.temperature_c)
    power = Family("sparkcluster_gpu_power_watts", "GPU power draw (nvidia-smi power.draw)")
    power.add(got.power_w)
    sm = Family("sparkcluster_gpu_sm_clock_hertz", "GPU SM clock (nvidia-smi clocks.sm)")
    sm.add(None if got.sm_clock_mhz is None else got.sm_clock_mhz * 1e6)
    event = Family("sparkcluster_gpu_clock_event", "1 while this clocks-event reason is active (nvidia-smi "
                   "clocks_event_reasons); throttle=1 for the reasons that slow the GPU against the load's will")
    throttled = Family("sparkcluster_gpu_throttled", "1 while any throttle reason is active")
    if got.clock_events is not None:
        for reason in EVENT_BITS:
            event.add(1 if reason in got.clock_events else 0, reason=str(reason),
                      throttle="1" if reason in THROTTLES else "0")
        throttled.add(1 if got.throttles else 0)
    return [up, temp, power, sm, event, throttled]


def memory_families(meminfo: Mapping[str, int]) -> list[Family]:
    """From /proc/meminfo (kB): unified memory (the GB10's GPU shares it) and the CMA pool."""
    out = []
    for key, name, what in (("MemTotal", "memory_total_bytes", "unified memory, total (MemTotal)"),
                            ("MemAvailable", "memory_available_bytes", "unified memory available (MemAvailable)"),
                            ("CmaTotal", "cma_total_bytes", "CMA pool, total (CmaTotal)"),
                            ("CmaFree", "cma_free_bytes", "CMA pool, free (CmaFree)")):
        family = Family(f"sparkcluster_{name}", what)
        family.add(meminfo[key] * 1024 if key in meminfo else None)
        out.append(family)
    return out


def kernel_families(log: KernelLog | None) -> list[Family]:
    readable = Family("sparkcluster_kernel_log_readable", "1 where this boot's kernel log could be read "
                      "(journalctl or dmesg, as doctor reads it)")
    readable.add(0 if log is None or log.source is None else 1)
    if log is None or log.source is None:
        return [readable]
    events = Family("sparkcluster_kernel_events_total", "kernel-log events of this boot by kind (doctor's reader)",
                    "counter")
    counts: Counter[str] = Counter(e.kind for e in log.events)
    for kind in KERNEL_KINDS:
        events.add(counts.get(kind, 0), kind=kind)
    xid = Family("sparkcluster_kernel_xid_total", "NVRM Xid errors of this boot by Xid number", "counter")
    for number, count in sorted(Counter(e.xid for e in log.events if e.xid is not None).items()):
        xid.add(count, xid=str(number))
    return [readable, events, xid]


def qsfp_families(twins: Sequence[QsfpTwin]) -> list[Family]:
    up = Family("sparkcluster_qsfp_up", "1 while the QSFP twin's netdev is up (operstate)")
    used = Family("sparkcluster_qsfp_used", "1 for a twin the node uses: up, or its carrier came up since boot "
                  "(a twin no cable ever lit is not down)")
    speed = Family("sparkcluster_qsfp_speed_mbps", "the twin's negotiated speed (sysfs speed), absent without link")
    expected = Family("sparkcluster_qsfp_expected_speed_mbps", "the speed a Spark's QSFP twin runs at")
    data = Family("sparkcluster_roce_bytes_total", "RoCE bytes by direction (IB port_*_data x 4)", "counter")
    packets = Family("sparkcluster_roce_packets_total", "RoCE packets by direction", "counter")
    errors = Family("sparkcluster_roce_errors_total", "RoCE error and discard counters by name", "counter")
    congestion = Family("sparkcluster_roce_congestion_total", "RoCE ECN marks and CNPs by counter", "counter")
    for twin in twins:
        labels = {"netdev": twin.netdev, "port": str(twin.port), "hca": twin.hca or ""}
        up.add(1 if twin.up else 0, **labels)
        used.add(1 if twin.used else 0, **labels)
        speed.add(twin.speed_mbps, **labels)
        expected.add(FULL_SPEED_MBPS, **labels)
        for name, direction in DATA_WORDS.items():
            data.add(None if name not in twin.counters else twin.counters[name] * 4, direction=direction, **labels)
        for name, direction in PACKETS.items():
            packets.add(twin.counters.get(name), direction=direction, **labels)
        for name in ERRORS:
            errors.add(twin.counters.get(name), counter=name, **labels)
        for name in CONGESTION:
            congestion.add(twin.counters.get(name), counter=name, **labels)
    return [up, used, speed, expected, data, packets, errors, congestion]


def hf_cache_families(free_bytes: int | None, size_bytes: int | None) -> list[Family]:
    free = Family("sparkcluster_hf_cache_free_bytes", "free space on the HF cache's filesystem (for its user)")
    free.add(free_bytes)
    size = Family("sparkcluster_hf_cache_size_bytes", "size of the HF cache's filesystem")
    size.add(size_bytes)
    return [free, size]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def verify_families(doc: Mapping[str, Any] | None, at_s: float | None) -> list[Family]:
    """The last verify's record (nccl/lastverify.py's record_doc, kept at LAST_VERIFY_PATH)."""
    present = Family("sparkcluster_verify_recorded", f"1 where the node keeps a last verify ({LAST_VERIFY_PATH})")
    present.add(0 if doc is None else 1)
    if doc is None:
        return [present]
    status = str(doc.get("status", ""))
    passed = Family("sparkcluster_verify_pass", "1 where the last verify passed")
    passed.add(1 if status == "PASS" else 0, backend=str(doc.get("backend", ""))[:40])
    when = Family("sparkcluster_verify_timestamp_seconds", "when the last verify ran")
    when.add(at_s)
    busbw = Family("sparkcluster_verify_busbw_bytes_per_second", "the last verify's busbw at its largest size, "
                   "group=all for the whole group, else one link alone")
    g = _number(doc.get("busbw_gbps"))
    busbw.add(None if g is None else g * 1e9, group="all")
    links = doc.get("links")
    for label, value in (links.items() if isinstance(links, dict) else ()):
        v = _number(value)
        busbw.add(None if v is None else v * 1e9, group="link", link=str(label)[:80])
    latency = Family("sparkcluster_verify_latency_seconds", "the last verify's all_reduce median latency by "
                     "message size, group=all for the whole group, else one link alone")
    for size, us in (doc.get("latency_us") or {}).items() if isinstance(doc.get("latency_us"), dict) else ():
        v = _number(us)
        latency.add(None if v is None else v / 1e6, group="all", size_bytes=str(size)[:20])
    per_link = doc.get("links_latency_us")
    for label, sizes in (per_link.items() if isinstance(per_link, dict) else ()):
        for size, us in (sizes.items() if isinstance(sizes, dict) else ()):
            v = _number(us)
            latency.add(None if v is None else v / 1e6, group="link", link=str(label)[:80], size_bytes=str(size)[:20])
    return [present, passed, when, busbw, latency]


def supervisor_families(files: SupervisorFiles) -> list[Family]:
    present = Family("sparkcluster_supervisor_up", "1 where the supervisor's state file is there and readable")
    present.add(1 if files.state else 0)
    state = Family("sparkcluster_supervisor_state", "1 for the supervisor's current state, 0 for the others")
    since = Family("sparkcluster_supervisor_state_since_timestamp_seconds", "when the supervisor entered its state")
    restarts = Family("sparkcluster_supervisor_restarts_last_hour", "the supervisor's restarts in the last hour")
    if files.state:
        for watch in WatchState:
            state.add(1 if files.state.state == watch else 0, state=str(watch))
        since.add(epoch_seconds(files.state.since))
        restarts.add(files.state.restarts_last_hour)
    if not (files.events_present or files.state):
        return [present, state, since, restarts]
    seen = Family("sparkcluster_supervisor_seen_total", "incidents by what was seen, each kind at 0 from the start "
                  "(so that a first one is an increase)", "counter")
    by_seen = Counter(str(i.seen) for i in files.incidents)
    for seen_kind in Seen:
        seen.add(by_seen.get(str(seen_kind), 0), seen=str(seen_kind))
    incidents = Family("sparkcluster_supervisor_incidents_total", "incidents by target, what was seen, what was "
                       "done and how it ended (events.jsonl)", "counter")
    for (target, kind, action, outcome), count in sorted(
            Counter((i.target, str(i.seen), str(i.action), str(i.outcome)) for i in files.incidents).items()):
        incidents.add(count, target=target, seen=kind, action=action, outcome=outcome)
    detected = [i.detected_s for i in files.incidents if i.detected_s is not None]
    recovered = [i.recovered_s for i in files.incidents if i.recovered_s is not None and i.outcome == "recovered"]
    out = [present, state, since, restarts, seen, incidents]
    for name, what, values in (
            ("detection", "time from the fault to its detection, over incidents", detected),
            ("recovery", "time from detection to recovery, over recovered incidents", recovered)):
        total = Family(f"sparkcluster_supervisor_{name}_seconds_sum", f"{what}: the sum", "counter")
        how_many = Family(f"sparkcluster_supervisor_{name}_seconds_count", f"{what}: how many", "counter")
        total.add(sum(values))
        how_many.add(len(values))
        out += [total, how_many]
    last = Family("sparkcluster_supervisor_last_recovery_seconds", "the last recovered incident's recovery time")
    last.add(recovered[-1] if recovered else None)
    skipped = Family("sparkcluster_supervisor_unread_event_lines", "events.jsonl lines that are not version-1 "
                     "incidents")
    skipped.add(files.skipped_lines)
    return [*out, last, skipped]
