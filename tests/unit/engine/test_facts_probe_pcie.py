"""The facts probe's PCIe lines, made with shell built-ins only: run by a real shell over a stand-in sysfs tree,
they say what the old `cat | tr` per value said (spaces as `_`, `-` for a value that cannot be read, a device
without a netdev left out)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sparkcluster.engine.facts import PROBE_SCRIPT


def pcie_snippet(root: Path) -> str:
    start = PROBE_SCRIPT.index("for d in /sys/class/infiniband/*/device")
    end = PROBE_SCRIPT.index("\ndone", start) + len("\ndone")
    return PROBE_SCRIPT[start:end].replace("/sys/class/infiniband", str(root))


def device(root: Path, hca: str, netdevs: list[str], values: dict[str, str]) -> None:
    d = root / hca / "device"
    (d / "net").mkdir(parents=True)
    for n in netdevs:
        (d / "net" / n).mkdir()
    for name, value in values.items():
        (d / name).write_text(value)


def test_each_rdma_devices_pcie_link_in_one_line(tmp_path: Path) -> None:
    full = {"current_link_speed": "16.0 GT/s PCIe\n", "current_link_width": "2\n",
            "max_link_speed": "32.0 GT/s PCIe\n", "max_link_width": "4\n"}
    device(tmp_path, "rocep1s0f1", ["enp1s0f1np1", "enp1s0f1np1v0"], full)
    device(tmp_path, "roceP2p1s0f1", ["enP2p1s0f1np1"], {"current_link_speed": "32.0 GT/s PCIe"})  # no newline
    device(tmp_path, "mlx5_9", [], full)  # no netdev: no line
    out = subprocess.run(["sh", "-c", pcie_snippet(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["pcie enP2p1s0f1np1 32.0_GT/s_PCIe - - -",
                                "pcie enp1s0f1np1 16.0_GT/s_PCIe 2 32.0_GT/s_PCIe 4"]
