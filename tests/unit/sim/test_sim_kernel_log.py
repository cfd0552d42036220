"""The simulated Spark's kernel log: `journalctl -k` and `dmesg` print the boot's lines and what `sim hardware
--kernel-log` planted, in the real tools' line shapes, and refuse options they do not emulate."""

from __future__ import annotations

import json
import re
import subprocess
import time
from importlib import resources

import pytest

from sparkcluster.engine.errors import UsageError
from sparkcluster.sim.hardware import EMULATORS, hardware_doc, kernel_log_entry
from sparkcluster.sim.topology import Subnets, build_topology

HOST = resources.files("sparkcluster.sim") / "host"
XID = "NVRM: Xid (PCI:000f:01:00): 79, pid=2113, name=python3, GPU has fallen off the bus."
OOM = "Out of memory: Killed process 48213 (python3) total-vm:120731128kB, anon-rss:98309120kB, file-rss:0kB"


@pytest.fixture
def hardware(tmp_path):
    host = build_topology("lab", 2, Subnets(120), ["580.95.05"]).hosts[1]
    now = time.time()
    doc = hardware_doc("lab", host, {"kernel_log": [kernel_log_entry(XID, now - 5), kernel_log_entry(OOM, now - 1)]})
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(doc))
    kernel = tmp_path / "kernel"
    kernel.write_text("7.0.0-1019-nvidia\n")
    return {"SPARKCLUSTER_SIM_HARDWARE": str(path), "SPARKCLUSTER_SIM_KERNEL": str(kernel), "PATH": "/usr/bin:/bin"}


def tool(env, name, *args):
    return subprocess.run(["sh", str(HOST / name), *args], capture_output=True, text=True, env=env)


def test_journalctl_k_prints_the_planted_lines_as_kernel_messages(hardware):
    out = tool(hardware, "journalctl", "-k", "-b", "--no-pager")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert re.fullmatch(r"[A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d \S+ kernel: Linux version 7\.0\.0-1019-nvidia .*", lines[0])
    assert re.fullmatch(r"[A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d \S+ kernel: " + re.escape(XID), lines[-2])
    assert lines[-1].endswith(" kernel: " + OOM)


def test_journalctl_bounds_and_formats(hardware):
    last = tool(hardware, "journalctl", "-k", "-n", "1", "-o", "short-iso")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d \S+ kernel: " + re.escape(OOM) + "\n", last.stdout)
    assert tool(hardware, "journalctl", "--dmesg", "--lines=2", "-o", "cat").stdout == f"{XID}\n{OOM}\n"
    assert tool(hardware, "journalctl", "-k", "--since", "-3s", "-o", "cat").stdout == f"{OOM}\n"
    assert tool(hardware, "journalctl", "-k", "--since", "@4102444800").stdout == "-- No entries --\n"
    assert tool(hardware, "journalctl", "-k", "-q", "--since", "@4102444800").stdout == ""


def test_journalctl_refuses_what_it_does_not_emulate(hardware):
    for args in (("-u", "ray", "-b", "-1"), ("-k", "-u", "ray"), ("-k", "-b", "1"), ("-k", "-o", "json"),
                 ("-k", "-p", "err")):
        out = tool(hardware, "journalctl", *args)
        assert out.returncode == 1 and "emulated by sparkcluster sim" in out.stderr, args
    assert tool(hardware, "journalctl", "-k", "--since", "soon").stderr == "Failed to parse timestamp: soon\n"


def test_dmesg_prints_seconds_since_boot_then_the_message(hardware):
    lines = tool(hardware, "dmesg").stdout.splitlines()
    assert re.fullmatch(r"\[\s*0\.000000\] Linux version 7\.0\.0-1019-nvidia .*", lines[0])
    assert re.fullmatch(r"\[\s*\d+\.\d{6}\] " + re.escape(XID), lines[-2])
    assert re.fullmatch(r"\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\] " + re.escape(OOM),
                        tool(hardware, "dmesg", "-T").stdout.splitlines()[-1])
    iso = tool(hardware, "dmesg", "--time-format", "iso").stdout.splitlines()[-1]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d " + re.escape(OOM), iso)
    assert tool(hardware, "dmesg", "-w").returncode == 1


def test_a_fresh_host_logs_only_its_boot(tmp_path):
    host = build_topology("lab", 1, Subnets(120), ["580.95.05"]).hosts[0]
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(hardware_doc("lab", host)))
    out = tool({"SPARKCLUSTER_SIM_HARDWARE": str(path), "PATH": "/usr/bin:/bin"}, "dmesg", "-t")
    assert len(out.stdout.splitlines()) == 2 and "NVRM" not in out.stdout


def test_a_planted_line_is_one_line_of_text():
    for bad in ("", "  ", "NVRM: Xid 79\nsecond line"):
        with pytest.raises(UsageError):
            kernel_log_entry(bad, 0.0)


def test_the_kernel_log_tools_are_installed_on_every_host():
    assert {"sim-kernel-log", "journalctl", "dmesg"} <= set(EMULATORS)
    assert all((HOST / name).is_file() for name in EMULATORS)


def previous_host(tmp_path, **settings):
    host = build_topology("lab", 1, Subnets(120), ["580.95.05"]).hosts[0]
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(hardware_doc("lab", host, settings)))
    return {"SPARKCLUSTER_SIM_HARDWARE": str(path), "PATH": "/usr/bin:/bin"}


def test_journalctl_b_minus_1_prints_the_previous_boot_ending_before_this_one(tmp_path):
    env = previous_host(tmp_path, kernel_log_previous=[kernel_log_entry(OOM, 1000.0), kernel_log_entry(XID, 1010.0)])
    out = tool(env, "journalctl", "-k", "-b", "-1", "-o", "short-iso", "--no-pager", "-q")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [l.split(" kernel: ", 1)[1] for l in lines][2:] == [OOM, XID] and "Linux version" in lines[0]
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d \S+ kernel: "
    assert all(re.match(stamp, l) for l in lines), lines
    this = tool(env, "journalctl", "-k", "-b", "-o", "short-unix").stdout.splitlines()
    before = [float(l.split()[0]) for l in tool(env, "journalctl", "-k", "--boot=-1", "-o", "short-unix").stdout.splitlines()]
    assert float(this[0].split()[0]) - before[-1] == pytest.approx(30, abs=0.01)  # it ended 30 s before this boot
    assert before[-1] - before[-2] == pytest.approx(10, abs=0.01)  # the planted lines keep their spacing
    assert XID not in tool(env, "journalctl", "-k", "-b").stdout and XID not in tool(env, "dmesg").stdout


def test_journalctl_says_what_the_real_one_says_without_a_previous_boot(tmp_path):
    none = tool(previous_host(tmp_path), "journalctl", "-k", "-b", "-1", "-q")
    assert (none.returncode, none.stdout) == (1, "")
    assert none.stderr == "Data from the specified boot (-1) is not available: No such boot ID in journal\n"
    older = tool(previous_host(tmp_path, kernel_log_previous=[kernel_log_entry(XID, 5.0)]), "journalctl", "-k", "-b", "-2")
    assert older.stderr.startswith("Data from the specified boot (-2) is not available") and older.returncode == 1
    volatile = previous_host(tmp_path, journal="volatile", kernel_log_previous=[kernel_log_entry(XID, 5.0)])
    memory = tool(volatile, "journalctl", "-k", "-b", "-1", "-q")
    assert (memory.returncode, memory.stdout) == (0, "")
    assert memory.stderr == "Specifying boot ID or boot offset has no effect, no persistent journal was found.\n"
    assert "Linux version" in tool(volatile, "journalctl", "-k", "-b").stdout  # this boot is read as before
