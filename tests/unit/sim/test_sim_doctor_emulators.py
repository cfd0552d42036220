"""The emulated tools doctor and its bundle read print the real tools' shapes: `ethtool -i` (driver, firmware,
bus-info), `ethtool --show-fec`, `uname -r` of a host given another kernel, `nvidia-smi -q`; and the rendered
BIOS, CMA and PCIe values a host is given."""

from __future__ import annotations

import json
import subprocess
from importlib import resources

from sparkcluster.node.health import parse_ethtool_i
from sparkcluster.sim.hardware import dmi_files, hardware_doc, meminfo, write_infiniband_tree
from sparkcluster.sim.topology import Subnets, build_topology

HOST = resources.files("sparkcluster.sim") / "host"


def ethtool(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    speeds = tmp_path / "speeds"
    speeds.write_text("lo 200000 qsfp\n")
    firmware = tmp_path / "firmware"
    firmware.write_text("28.41.1000 (NVD0000000033)\n")
    return subprocess.run(["sh", str(HOST / "ethtool"), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "SPARKCLUSTER_SIM_SPEEDS": str(speeds),
                               "SPARKCLUSTER_SIM_FIRMWARE": str(firmware)})


def test_ethtool_i_reports_the_firmware_a_host_was_given(tmp_path):
    out = ethtool(tmp_path, "-i", "lo")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "driver: mlx5_core" and "firmware-version: 28.41.1000 (NVD0000000033)" in lines
    firmware, driver = parse_ethtool_i([f"lo {line}" for line in lines])
    assert firmware == {"lo": "28.41.1000 (NVD0000000033)"} and driver["lo"].startswith("mlx5_core ")


def test_ethtool_show_fec_and_a_bad_flag(tmp_path):
    out = ethtool(tmp_path, "--show-fec", "lo")
    lines = out.stdout.splitlines()
    assert lines[0] == "FEC parameters for lo:" and lines[1].startswith("Supported/Configured FEC encodings: ")
    assert lines[2] == "Active FEC encoding: None"  # lo is not `up`; a cabled twin says RS (test_serve_docker)
    assert ethtool(tmp_path, "-S", "lo").returncode == 1


def test_uname_r_prints_the_given_kernel_and_passes_the_rest_through(tmp_path):
    kernel = tmp_path / "kernel"
    run = lambda *a: subprocess.run(["sh", str(HOST / "uname"), *a], capture_output=True, text=True,  # noqa: E731
                                    env={"SPARKCLUSTER_SIM_KERNEL": str(kernel)}).stdout.strip()
    real = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()
    assert run("-r") == real  # no kernel given: the real one
    kernel.write_text("7.0.0-1019-nvidia\n")
    assert run("-r") == "7.0.0-1019-nvidia"
    assert run("-m") == subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip()


def test_nvidia_smi_q_names_driver_and_cuda(tmp_path):
    host = build_topology("lab", 1, Subnets(120), ["580.95.05"]).hosts[0]
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(hardware_doc("lab", host, {"driver": "590.48.01"})))
    out = subprocess.run(["/usr/bin/python3", str(HOST / "nvidia-smi"), "-q"], capture_output=True, text=True,
                         env={"SPARKCLUSTER_SIM_HARDWARE": str(path)}).stdout
    assert "==============NVSMI LOG==============" in out
    assert "Driver Version                            : 590.48.01" in out and "CUDA Version" in out
    assert "Product Name                          : NVIDIA GB10" in out


def test_bios_cma_and_pcie_width_a_host_is_given(tmp_path):
    assert dmi_files({"bios_version": "5.20", "bios_date": "01/15/2026"})["bios_date"] == "01/15/2026"
    text = meminfo("MemTotal:       124544304 kB\nCmaTotal:          65536 kB\n", 0)
    assert "CmaTotal:              0 kB" in text and text.count("CmaTotal") == 1
    host = build_topology("lab", 1, Subnets(120), ["580.95.05"]).hosts[0]
    write_infiniband_tree(host, tmp_path, pcie_width={"enP2p1s0f1np1": "2"})
    hca = next(n.hca for n in host.nics if n.netdev == "enP2p1s0f1np1")
    device = tmp_path / str(hca) / "device"
    assert (device / "current_link_width").read_text() == "2\n" and (device / "max_link_width").read_text() == "4\n"
