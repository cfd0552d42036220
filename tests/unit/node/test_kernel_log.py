"""The kernel log as the doctor reads it (node/kernellog.py): lines in the formats journalctl -k and dmesg print
(tests/fixtures/doctor/kernel-log-*.txt), each shape parsed into an event, and each kind named once per node
with the time, the meaning and the fix; the script that reads it is bounded in lines and bytes."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

from sparkcluster.node.finding import Severity
from sparkcluster.node.health import health_command, parse_health
from sparkcluster.node.kernellog import (
    KERNEL_LOG_SCRIPT,
    MAX_BYTES,
    MAX_LINES,
    XIDS,
    KernelLog,
    kernel_log_findings,
    parse_event,
    parse_kernel_log,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "doctor"


def section(name: str, source: str = "journalctl") -> list[str]:
    lines = (FIXTURES / name).read_text().splitlines()
    return [f"source {source}", *(f"line {l}" for l in lines), f"read {len(lines) + 500}"]


def by_check(findings: list) -> dict:
    return {f.check: f for f in findings}


def test_each_shape_of_the_journal_is_an_event_with_its_time():
    log = parse_kernel_log(section("kernel-log-journal.txt"))
    assert log.source == "journalctl" and log.lines_read == 526
    kinds = [e.kind for e in log.events]
    assert kinds.count("xid") == 4 and kinds.count("nv-no-memory") == 2 and kinds.count("mlx5-timeout") == 2
    assert kinds.count("link-down") == 3 and kinds.count("aer") == 2 and kinds.count("oom-kill") == 1
    xid79 = next(e for e in log.events if e.xid == 79)
    assert xid79.time == "2026-11-27T10:31:40+00:00" and xid79.device == "000f:01:00"
    assert xid79.text.startswith("NVRM: Xid (PCI:000f:01:00): 79")
    assert "0002:01:00.0" in log.connectx and "0000:01:00.1" in log.connectx


def test_dmesg_plain_and_iso_stamps_and_the_other_message_shapes():
    plain = parse_kernel_log(section("kernel-log-dmesg.txt", "dmesg (sudo)"))
    assert [(e.kind, e.xid) for e in plain.events] == [("xid", 119), ("xid", 31), ("mlx5-timeout", None),
                                                       ("oom-kill", None)]
    assert plain.events[0].time == "12.345678 s after boot" and plain.events[3].process == "4242 (python3)"
    iso = parse_kernel_log(section("kernel-log-dmesg-iso.txt", "dmesg"))
    assert [e.kind for e in iso.events] == ["xid", "aer", "oom-kill"]
    assert iso.events[0].time == "2026-11-27T10:31:40,118022+00:00" and iso.events[1].severity == "fatal"
    # journalctl's default short format, and a syslog line that kept the kernel's own stamp
    short = parse_event("Nov 27 10:12:03 spark-2 kernel: [ 4711.000001] NVRM: Xid (PCI:000f:01:00): 62, pid=1, name=x")
    assert short and short.xid == 62 and short.time == "Nov 27 10:12:03" and short.text.startswith("NVRM")
    assert parse_event("2026-11-27T09:58:03+00:00 spark-2 kernel: mlx5_core 0000:01:00.0: firmware version: 28.45.1200") \
        is None
    assert parse_event("2026-11-27T11:45:52+00:00 spark-2 kernel: python3 invoked oom-killer: gfp_mask=0x140cca") is None


def test_the_journal_is_named_per_kind_with_meaning_time_and_fix():
    found = kernel_log_findings("spark-2", parse_kernel_log(section("kernel-log-journal.txt")), driver="580.173.02")
    checks = by_check(found)
    assert set(checks) == {"Xid 13", "Xid 43", "Xid 79", "NV_ERR_NO_MEMORY", "mlx5 command timeout", "link flaps",
                           "PCIe AER", "OOM kill"}
    assert all(f.nodes == ("spark-2",) and f.group == "kernel log" and f.summary.startswith("spark-2: ") for f in found)
    x79 = checks["Xid 79"]
    assert x79.severity is Severity.FAIL and "fallen off the bus" in x79.summary and "10:31:40" in x79.summary
    assert "AC removed" in x79.fix
    x13 = checks["Xid 13"]
    assert x13.severity is Severity.WARN and "2 times, last at 2026-11-27T10:12:03+00:00" in x13.summary
    nomem = checks["NV_ERR_NO_MEMORY"]
    assert "driver 580.173.02" in nomem.summary and nomem.source == "NVIDIA/open-gpu-kernel-modules#1358"
    assert "--gpu-memory-utilization" in nomem.fix
    timeout = checks["mlx5 command timeout"]
    assert timeout.severity is Severity.FAIL and "0000:01:00.1" in timeout.summary and "modprobe mlx5_core" in timeout.fix
    flaps = checks["link flaps"]  # enp1s0f1np1 went down twice; enP2p1s0f1np1 once (a peer's reboot) is not a flap
    assert "enp1s0f1np1 went down 2 times" in flaps.summary and "enP2p1s0f1np1" not in flaps.summary
    aer = [f for f in found if f.check == "PCIe AER"]
    assert [f.severity for f in aer] == [Severity.FAIL, Severity.WARN]
    assert "non-fatal" in aer[0].summary and "0002:01:00.0 (ConnectX)" in aer[0].summary
    oom = checks["OOM kill"]
    assert "vLLM process 31337 (VLLM::EngineCor)" in oom.summary and "11:45:52" in oom.summary
    assert "shm_size" in oom.fix


def test_every_common_xid_has_a_meaning():
    for xid in (13, 31, 43, 45, 48, 62, 63, 64, 74, 79, 94, 95, 119):
        meaning, severity, _ = XIDS[xid]
        assert meaning and severity in (Severity.WARN, Severity.FAIL)
    odd = kernel_log_findings("spark-1", parse_kernel_log(["source dmesg", "line [1.0] NVRM: Xid (PCI:000f:01:00): 999, x",
                                                           "read 1"]))
    assert odd[0].check == "Xid 999" and "Xid catalog" in odd[0].summary


def test_a_clean_log_passes_and_an_unreadable_one_is_a_warning_with_the_fix():
    clean = kernel_log_findings("spark-1", parse_kernel_log(["source journalctl", "read 812"]))
    assert [(f.severity, f.check) for f in clean] == [(Severity.OK, "kernel log")] and "812 lines" in clean[0].summary
    unread = kernel_log_findings("spark-1", parse_kernel_log(["unreadable"]))
    assert unread[0].severity is Severity.WARN and "usermod -aG adm" in unread[0].fix
    assert KernelLog() == parse_kernel_log([])


def test_the_probe_carries_the_bounded_reader_and_its_section_is_parsed(tmp_path):
    script = health_command("").script
    assert KERNEL_LOG_SCRIPT in script and f"tail -n {MAX_LINES + 1}" in script and f"tail -c {MAX_BYTES}" in script
    text = "@@sparkcluster@@ d-kernel-log\n" + "\n".join(section("kernel-log-dmesg.txt", "dmesg")) + "\n"
    assert [e.xid for e in parse_health(text, "").kernel_log.events if e.kind == "xid"] == [119, 31]


def test_the_reader_falls_back_and_bounds_what_it_prints(tmp_path):
    """The script itself, with a journalctl that cannot read and a dmesg that prints 5,000 matching lines."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "journalctl").write_text("#!/bin/sh\necho 'No journal files were opened' >&2; exit 1\n")
    (bin_dir / "sudo").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "dmesg").write_text("#!/bin/sh\ni=0; while [ $i -lt 5000 ]; do "
                                   "echo \"[$i.000000] NVRM: Xid (PCI:000f:01:00): 13, pid=$i, $(printf '%0600d' 0)\"; "
                                   "i=$((i+1)); done; echo '[9.9] usb 1-1: new device'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    out = subprocess.run(["sh", "-c", KERNEL_LOG_SCRIPT], capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout
    this_boot, _, rest = out.partition("previous ")  # then the previous boot's: the journal alone, unreadable here
    assert this_boot.startswith("source dmesg\n") and this_boot.rstrip().endswith("read 5001")
    assert len(this_boot.encode()) <= MAX_BYTES + 64 and all(len(l) <= 5 + 400 for l in this_boot.splitlines())
    assert rest.startswith("unreadable\nprevious said No journal files were opened\n")
    log = parse_kernel_log(out.splitlines())
    assert log.source == "dmesg" and log.lines_read == 5001 and 0 < len(log.events) <= MAX_LINES
    assert log.events[-1].text.startswith("NVRM: Xid (PCI:000f:01:00): 13, pid=4999")  # the newest kept


# ---- the previous boot (journalctl -k -b -1): where a node that hung or rebooted left its evidence ----------
def previous(name: str | None = None, *said: str, last: str = "2026-11-27T02:18:02+00:00") -> list[str]:
    """The previous boot's part of the section, as the script prints it after this boot's."""
    if name is None:
        return ["previous source journalctl", *(f"previous said {w}" for w in said), "previous read 0"]
    lines = (FIXTURES / name).read_text().splitlines()
    return ["previous source journalctl", *(f"previous line {l}" for l in lines), f"previous last {last}",
            f"previous read {len(lines) + 900}"]


NO_SUCH_BOOT_SAID = "Data from the specified boot (-1) is not available: No such boot ID in journal"
NOT_PERSISTENT_SAID = "Specifying boot ID or boot offset has no effect, no persistent journal was found."


def test_the_previous_boot_is_parsed_apart_with_when_it_ended():
    log = parse_kernel_log(section("kernel-log-dmesg-iso.txt", "dmesg") + previous("kernel-log-previous-boot.txt"))
    assert [e.kind for e in log.events] == ["xid", "aer", "oom-kill"]  # this boot's own, unchanged
    before = log.previous_boot
    assert before is not None and before.state == "read" and before.source == "journalctl"
    assert before.lines_read == 909 and before.ended == "2026-11-27T02:18:02+00:00"
    assert [(e.kind, e.xid) for e in before.events] == [("link-up", None), ("nv-no-memory", None), ("xid", 79),
                                                        ("mlx5-timeout", None)]
    assert before.events[2].time == "2026-11-27T02:17:58+00:00" and "0000:01:00.1" in before.connectx
    json_log = json.loads(json.dumps(asdict(log)))  # as doctor --json and the bundle's health.json hold it
    assert json_log["previous_boot"]["state"] == "read" and json_log["previous_boot"]["events"][2]["xid"] == 79
    assert [e["kind"] for e in json_log["events"]] == ["xid", "aer", "oom-kill"]
    assert parse_kernel_log(section("kernel-log-dmesg.txt")).previous_boot is None  # an older probe: not looked at


def test_a_crash_in_the_previous_boot_is_named_so_and_ranks_as_this_boots_would():
    found = kernel_log_findings("spark-2", parse_kernel_log(["source journalctl", "read 40",
                                                             *previous("kernel-log-previous-boot.txt")]))
    checks = by_check(found)
    assert set(checks) == {"kernel log", "NV_ERR_NO_MEMORY (previous boot)", "Xid 79 (previous boot)",
                           "mlx5 command timeout (previous boot)"}
    assert checks["kernel log"].severity is Severity.OK and "40 lines of this boot" in checks["kernel log"].summary
    x79 = checks["Xid 79 (previous boot)"]
    assert x79.summary.startswith("spark-2: in the previous boot (its log ends at 2026-11-27T02:18:02+00:00): "
                                  "NVRM Xid 79 at 2026-11-27T02:17:58+00:00 (GPU has fallen off the bus")
    # ranked as this boot's: the same words, severity and fix as the same lines would get in this boot
    now = by_check(kernel_log_findings("spark-2", parse_kernel_log(section("kernel-log-previous-boot.txt"))))
    for check in ("Xid 79", "NV_ERR_NO_MEMORY", "mlx5 command timeout"):
        was = checks[f"{check} (previous boot)"]
        assert (was.severity, was.fix, was.nodes) == (now[check].severity, now[check].fix, now[check].nodes), check
        assert was.summary == now[check].summary.replace("spark-2: ", "spark-2: in the previous boot (its log ends at "
                                                         "2026-11-27T02:18:02+00:00): ", 1)
    assert x79.severity is Severity.FAIL and "AC removed" in x79.fix
    clean = kernel_log_findings("spark-1", parse_kernel_log(["source journalctl", "read 40", "previous source journalctl",
                                                             "previous last 2026-11-27T02:18:02+00:00",
                                                             "previous read 812"]))
    assert [(f.check, f.severity) for f in clean] == [("kernel log", Severity.OK), ("kernel log (previous boot)",
                                                                                   Severity.OK)]
    assert clean[1].summary == ("spark-1: in the previous boot (its log ends at 2026-11-27T02:18:02+00:00): 812 lines "
                                "read (journalctl), none of the known errors")


def test_no_previous_boot_passes_and_a_journal_in_memory_is_an_info_with_the_fix():
    none = kernel_log_findings("spark-1", parse_kernel_log(["source journalctl", "read 9",
                                                            *previous(None, NO_SUCH_BOOT_SAID)]))
    assert none[1].check == "kernel log (previous boot)" and none[1].severity is Severity.OK
    assert none[1].summary == f"spark-1: the journal holds no boot before this one (journalctl: {NO_SUCH_BOOT_SAID})"
    kept = parse_kernel_log(["source dmesg", "read 9", *previous(None, NOT_PERSISTENT_SAID)])
    assert kept.previous_boot is not None and kept.previous_boot.state == "not kept"
    info = kernel_log_findings("spark-1", kept)[1]
    assert info.severity is Severity.INFO and "not kept" in info.summary and NOT_PERSISTENT_SAID in info.summary
    for step in ("sudo mkdir -p /var/log/journal", "sudo systemd-tmpfiles --create --prefix /var/log/journal",
                 "sudo journalctl --flush", "Storage=persistent"):
        assert step in info.fix, step


def test_an_unreadable_previous_boot_warns_once():
    said = ["previous unreadable", "previous said sudo: a password is required"]
    warn = kernel_log_findings("spark-1", parse_kernel_log(["source dmesg", "read 9", *said]))[1]
    assert warn.severity is Severity.WARN and "sudo: a password is required" in warn.summary
    assert "usermod -aG adm" in warn.fix
    # this boot unreadable too: its one warning says it all
    assert len(kernel_log_findings("spark-1", parse_kernel_log(["unreadable", *said]))) == 1


def test_the_script_reads_the_previous_boot_from_the_simulators_journalctl(tmp_path):
    """The script itself against the simulated Spark's journalctl: a previous boot planted, none, a journal in memory."""
    from importlib import resources

    from sparkcluster.sim.hardware import hardware_doc, kernel_log_entry
    from sparkcluster.sim.topology import Subnets, build_topology

    host_dir = resources.files("sparkcluster.sim") / "host"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("journalctl", "sim-kernel-log"):
        (bin_dir / name).write_bytes((host_dir / name).read_bytes())
        (bin_dir / name).chmod(0o755)
    (bin_dir / "sudo").write_text("#!/bin/sh\necho 'sudo: a password is required' >&2; exit 1\n")
    (bin_dir / "sudo").chmod(0o755)
    spec = build_topology("lab", 1, Subnets(120), ["580.95.05"]).hosts[0]
    xid = "NVRM: Xid (PCI:000f:01:00): 79, pid=2113, name=python3, GPU has fallen off the bus."

    def read(**settings: object) -> KernelLog:
        path = tmp_path / "hardware.json"
        path.write_text(json.dumps(hardware_doc("lab", spec, settings)))
        out = subprocess.run(["sh", "-c", KERNEL_LOG_SCRIPT], capture_output=True, text=True, timeout=60,
                             env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SPARKCLUSTER_SIM_HARDWARE": str(path)})
        return parse_kernel_log(out.stdout.splitlines())

    crashed = read(kernel_log_previous=[kernel_log_entry(xid, 100.0)])
    assert crashed.source == "journalctl" and crashed.lines_read == 2 and not crashed.events
    before = crashed.previous_boot
    assert before is not None and before.state == "read" and before.lines_read == 3
    assert [e.xid for e in before.events] == [79] and before.ended == before.events[0].time
    x79 = by_check(kernel_log_findings("spark-2", crashed))["Xid 79 (previous boot)"]
    assert x79.severity is Severity.FAIL and f"in the previous boot (its log ends at {before.ended})" in x79.summary
    fresh = read().previous_boot
    assert fresh is not None and fresh.state == "none" and fresh.said == (NO_SUCH_BOOT_SAID,)
    memory = read(journal="volatile", kernel_log_previous=[kernel_log_entry(xid, 100.0)]).previous_boot
    assert memory is not None and memory.state == "not kept" and memory.said == (NOT_PERSISTENT_SAID,)


def test_doctor_prints_the_previous_boot_apart_and_an_info_with_its_fix_without_failing():
    import io

    from rich.console import Console

    from sparkcluster.doctor.render import render
    from sparkcluster.doctor.run import DoctorReport

    found = (kernel_log_findings("spark-1", parse_kernel_log(["source journalctl", "read 9",
                                                              *previous(None, NOT_PERSISTENT_SAID)]))
             + kernel_log_findings("spark-2", parse_kernel_log(["source journalctl", "read 9",
                                                                *previous("kernel-log-previous-boot.txt")])))
    report = DoctorReport("", {}, {}, tuple(found))
    out = io.StringIO()
    render(Console(file=out, width=400, soft_wrap=True, color_system=None), report)
    text = out.getvalue()
    assert "ok   kernel log: spark-1, spark-2" in text
    assert "info kernel log (previous boot): spark-1: the previous boot's kernel log is not kept" in text
    assert "fix: keep the journal on disk: sudo mkdir -p /var/log/journal" in text
    assert "FAIL Xid 79 (previous boot): spark-2: in the previous boot (its log ends at 2026-11-27T02:18:02+00:00)" in text
    assert report.failed  # the previous boot's Xid 79 fails as this boot's would
    assert not DoctorReport("", {}, {}, tuple(f for f in found if f.nodes == ("spark-1",))).failed  # info: no failure
