"""The support bundle keeps the mlx5 lines of the previous boot's kernel log beside this boot's (doctor/bundle.py),
read here from the simulated Spark's journalctl: a ConnectX that stopped answering before the reboot is in it, and
where there is no previous boot the file says why in journalctl's own words."""

from __future__ import annotations

import json
import subprocess
from importlib import resources

from sparkcluster.doctor.bundle import NODE_FILES, PRIVILEGED_ITEMS
from sparkcluster.sim.hardware import hardware_doc, kernel_log_entry
from sparkcluster.sim.topology import Subnets, build_topology

ITEM = "kernel-mlx5-previous-boot.txt"
TIMEOUT = ("mlx5_core 0000:01:00.1: wait_func_handle_exec_timeout:1159:(pid 911): cmd[0]: QUERY_VPORT_COUNTER(0x770) "
           "No done completion")
XID = "NVRM: Xid (PCI:000f:01:00): 79, pid=2113, name=python3, GPU has fallen off the bus."


def item_output(tmp_path, **settings: object) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("journalctl", "sim-kernel-log"):
        (bin_dir / name).write_bytes((resources.files("sparkcluster.sim") / "host" / name).read_bytes())
        (bin_dir / name).chmod(0o755)
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(hardware_doc("lab", build_topology("lab", 1, Subnets(120), ["580.95.05"]).hosts[0],
                                            settings)))
    return subprocess.run(["sh", "-c", PRIVILEGED_ITEMS[ITEM]], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SPARKCLUSTER_SIM_HARDWARE": str(path)}).stdout


def test_the_bundle_keeps_the_previous_boots_mlx5_lines(tmp_path):
    assert ITEM in NODE_FILES and "kernel-mlx5.txt" in NODE_FILES
    out = item_output(tmp_path, kernel_log=[kernel_log_entry("mlx5_core 0000:01:00.0: this boot", 9.0)],
                      kernel_log_previous=[kernel_log_entry(XID, 1.0), kernel_log_entry(TIMEOUT, 2.0)])
    assert out.splitlines()[0].endswith(" kernel: " + TIMEOUT) and len(out.splitlines()) == 1  # mlx5, that boot's


def test_without_a_previous_boot_the_file_says_why(tmp_path):
    assert item_output(tmp_path) == "Data from the specified boot (-1) is not available: No such boot ID in journal\n"
    volatile = item_output(tmp_path, journal="volatile")
    assert volatile == "Specifying boot ID or boot offset has no effect, no persistent journal was found.\n"
