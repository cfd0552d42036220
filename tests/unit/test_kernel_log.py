"""The kernel log as the doctor reads it (node/kernellog.py): lines in the formats journalctl -k and dmesg print
(tests/fixtures/doctor/kernel-log-*.txt), each shape parsed into an event, and each kind named once per node
with the time, the meaning and the fix; the script that reads it is bounded in lines and bytes."""

from __future__ import annotations

import subprocess
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

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"


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
    assert out.startswith("source dmesg\n") and out.rstrip().endswith("read 5001")
    assert len(out.encode()) <= MAX_BYTES + 64 and all(len(l) <= 5 + 400 for l in out.splitlines())
    log = parse_kernel_log(out.splitlines())
    assert log.source == "dmesg" and log.lines_read == 5001 and 0 < len(log.events) <= MAX_LINES
    assert log.events[-1].text.startswith("NVRM: Xid (PCI:000f:01:00): 13, pid=4999")  # the newest kept
