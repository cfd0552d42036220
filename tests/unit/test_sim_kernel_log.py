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
    for args in (("-u", "ray"), ("-k", "-b", "-1"), ("-k", "-o", "json"), ("-k", "-p", "err")):
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
