"""What cannot exist on a CPU machine, emulated at the hardware boundary for one simulated Spark.

The emulators themselves (nvidia-smi, ibdev2netdev, ethtool, the NVIDIA container hook, the kernel log's journalctl
and dmesg) are small scripts in host/; this module renders the data they read: /etc/sparkcluster-sim/hardware.json and a
/sys/class/infiniband tree shaped like the mlx5 driver's on a real Spark
(tests/fixtures/probe-spark.txt holds one such Spark's outputs).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..engine.errors import UsageError
from .topology import HostSpec, Nic

GPU_NAME = "NVIDIA GB10"
GB10_COMPUTE_CAP = "12.1"
HARDWARE_JSON = "etc/sparkcluster-sim/hardware.json"
SPEEDS = "etc/sparkcluster-sim/speeds"
PCIE_SPEED, PCIE_WIDTH = "32.0 GT/s PCIe", "4"
DEGRADED_PCIE = ("8.0 GT/s PCIe", "2")
EMULATORS = ("nvidia-smi", "ibdev2netdev", "ethtool", "nvidia-container-runtime-hook", "sim-gid-cache", "uname",
             "sim-kernel-log", "journalctl", "dmesg")
KERNEL_FILE = "etc/sparkcluster-sim/kernel"  # what the emulated `uname -r` prints; absent: the real kernel's
FIRMWARE_FILE = "etc/sparkcluster-sim/firmware"  # the ConnectX firmware the emulated `ethtool -i` reports
DEFAULT_FIRMWARE = "28.45.1200 (NVD0000000033)"
# What `sim hardware` may set on one host (the rest of a Spark's hardware is the same on every simulated one).
SETTINGS = ("driver", "kernel", "bios_version", "bios_date", "cma_total_kb", "firmware", "pcie_width", "kernel_log",
            "kernel_log_previous", "journal", "gpu_temp_c", "power_w", "sm_clock_mhz", "throttle")
# Where the emulated journald keeps its journal: on disk as DGX OS does (earlier boots stay readable), or in memory.
JOURNAL_STORAGE = ("persistent", "volatile")
# An idle GB10 as nvidia-smi reports it (P8, 208 MHz, ~4.5 W; its memory clock is not exposed): what the emulated
# nvidia-smi prints where `sim hardware --gpu-temp/--power-w/--sm-clock/--throttle` gave nothing else.
IDLE_GPU = {"gpu_temp_c": 41, "power_w": 4.52, "sm_clock_mhz": 208, "throttle": ["gpu_idle"]}
# nvidia-smi's names of the clocks-event reasons (`clocks_event_reasons.<name>`), by NVML bit.
CLOCK_EVENTS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
                "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
                "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100}
DEFAULT_DMI = {"sys_vendor": "NVIDIA", "product_name": "DGX Spark", "bios_vendor": "NVIDIA",
               "bios_version": "sim-5.36", "bios_date": "04/20/2026"}


def gpu_uuid(cluster: str, host: str) -> str:
    digest = hashlib.sha256(f"{cluster}/{host}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def hardware_doc(cluster: str, host: HostSpec, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "gpu": {
            "name": GPU_NAME,
            "driver_version": (settings or {}).get("driver", host.driver_version),
            "compute_cap": GB10_COMPUTE_CAP,
            "uuid": gpu_uuid(cluster, host.name),
            "pci_bus_id": "0000000F:01:00.0",
            "telemetry": gpu_telemetry(settings or {}),
        },
        # What the emulated `journalctl -k` and `dmesg` print after the boot's own lines: {"at": unix time, "message"}
        "kernel_log": list((settings or {}).get("kernel_log", [])),
        # What the emulated `journalctl -k -b -1` prints after that boot's own lines (none: no earlier boot), unless
        # the journal is volatile: then it keeps no earlier boot at all.
        "kernel_log_previous": list((settings or {}).get("kernel_log_previous", [])),
        "journal": (settings or {}).get("journal", JOURNAL_STORAGE[0]),
        "nics": [
            {"netdev": n.netdev, "hca": n.hca, "cabled": n.cabled, "speed_mbps": n.speed_mbps} for n in host.nics
        ],
    }


def gpu_telemetry(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The live figures the emulated nvidia-smi reports: those given, else an idle GB10's."""
    given = {key: settings.get(key, idle) for key, idle in IDLE_GPU.items()}
    active = set(given["throttle"])
    return {"temperature_c": given["gpu_temp_c"], "power_w": given["power_w"], "sm_clock_mhz": given["sm_clock_mhz"],
            "pstate": "P8" if active == {"gpu_idle"} else "P0",
            "clock_events": {name: name in active for name in CLOCK_EVENTS},
            "clock_events_active": f"0x{sum(CLOCK_EVENTS[name] for name in active):016x}"}


def kernel_log_entry(message: str, at: float) -> dict[str, Any]:
    """One line `sim hardware --kernel-log` plants, as the kernel printed it at `at` (unix time)."""
    if not message.strip() or any(c in message for c in "\n\r\0"):
        raise UsageError(f"--kernel-log {message!r} is not one line of text",
                         "give the message as the kernel prints it, e.g. --kernel-log 'NVRM: Xid (PCI:000f:01:00): "
                         "79, pid=2113, name=python3, GPU has fallen off the bus.'")
    return {"at": round(at, 6), "message": message}


def hardware_json(cluster: str, host: HostSpec, settings: Mapping[str, Any] | None = None) -> str:
    return json.dumps(hardware_doc(cluster, host, settings), indent=2) + "\n"


def dmi_files(settings: Mapping[str, Any]) -> dict[str, str]:
    """/sys/class/dmi/id of the host: the BIOS it was given, else the simulated default."""
    return {name: str(settings.get(name, value)) for name, value in DEFAULT_DMI.items()}


def write_dmi_tree(settings: Mapping[str, Any], root: Path) -> None:
    (root / "id").mkdir(parents=True, exist_ok=True)
    for name, value in dmi_files(settings).items():
        (root / "id" / name).write_text(value + "\n")


def meminfo(real: str, cma_total_kb: int) -> str:
    """/proc/meminfo as it is, with the CMA pool the host was given (free as large as the pool)."""
    kept = [line for line in real.splitlines() if not line.startswith(("CmaTotal:", "CmaFree:"))]
    return "\n".join([*kept, f"CmaTotal:       {cma_total_kb:8d} kB", f"CmaFree:        {cma_total_kb:8d} kB"]) + "\n"


def speeds_file(host: HostSpec) -> str:
    """What the emulated ethtool reads: `netdev Mb/s kind` per NIC (kind: qsfp or lan)."""
    return "".join(f"{n.netdev} {n.speed_mbps} {'qsfp' if n.hca else 'lan'}\n" for n in host.nics)


def _link_local_gid(mac: str) -> str:
    """fe80::/64 with the EUI-64 of the MAC, as the kernel derives the RoCE default GID."""
    octets = [int(x, 16) for x in mac.split(":")]
    octets[0] ^= 0x02
    eui = octets[:3] + [0xFF, 0xFE] + octets[3:]
    groups = [f"{eui[i]:02x}{eui[i + 1]:02x}" for i in range(0, 8, 2)]
    return ":".join(["fe80", "0000", "0000", "0000", *groups])


def _ipv4_gid(address: ipaddress.IPv4Address) -> str:
    """IPv4-mapped GID, e.g. 192.168.177.11 -> 0000:...:ffff:c0a8:b10b."""
    packed = address.packed
    return f"0000:0000:0000:0000:0000:ffff:{packed[0]:02x}{packed[1]:02x}:{packed[2]:02x}{packed[3]:02x}"


def gid_table(nic: Nic, ipv4: bool = True) -> list[tuple[str, str]]:
    """(gid, type) by index: 0/1 link-local RoCE v1/v2; 2/3 the IPv4-mapped pair when the port has an address.
    Inside a running host, sim-gid-cache keeps 2/3 in step with the netdev's address, as the kernel does."""
    gids = [(_link_local_gid(nic.mac), "IB/RoCE v1"), (_link_local_gid(nic.mac), "RoCE v2")]
    if nic.address is not None and ipv4:
        gids += [(_ipv4_gid(nic.address.ip), "IB/RoCE v1"), (_ipv4_gid(nic.address.ip), "RoCE v2")]
    return gids


def write_infiniband_tree(host: HostSpec, root: Path, ipv4_gids: bool = True,
                          pcie_width: Mapping[str, str] | None = None) -> None:
    """Render /sys/class/infiniband for the host's four RDMA devices into `root` (bind-mounted read-only).
    `pcie_width`: netdev -> the width its twin negotiated (a BIOS before April 2026 gives the second ConnectX x2)."""
    for nic in host.nics:
        if nic.hca is None:
            continue
        dev = root / nic.hca
        port = dev / "ports" / "1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / sub).mkdir(parents=True, exist_ok=True)
        (dev / "device" / "net" / nic.netdev).mkdir(parents=True, exist_ok=True)
        (dev / "node_type").write_text("1: CA\n")
        # Each twin is a PCIe Gen5 x4 function; `sim degrade` lowers what it negotiated, as a starved slot does.
        width = (pcie_width or {}).get(nic.netdev, PCIE_WIDTH)
        for name, value in (("current_link_speed", PCIE_SPEED), ("max_link_speed", PCIE_SPEED),
                            ("current_link_width", width), ("max_link_width", PCIE_WIDTH)):
            (dev / "device" / name).write_text(value + "\n")
        (port / "state").write_text("4: ACTIVE\n" if nic.cabled else "1: DOWN\n")
        (port / "phys_state").write_text("5: LinkUp\n" if nic.cabled else "3: Disabled\n")
        (port / "link_layer").write_text("Ethernet\n")
        for index, (gid, kind) in enumerate(gid_table(nic, ipv4_gids)):
            (port / "gids" / str(index)).write_text(gid + "\n")
            (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
            (port / "gid_attrs" / "ndevs" / str(index)).write_text(nic.netdev + "\n")
