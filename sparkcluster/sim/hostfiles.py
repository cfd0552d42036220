"""What a simulated host's hardware puts on its disk: hardware.json, firmware and kernel files, the DMI and InfiniBand
sysfs trees, the emulated tools and its host keys, written into its upper layer before every boot."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from . import hardware, machine
from .state import ClusterState
from .topology import HostSpec

HOST_FILES = resources.files("sparkcluster.sim") / "host"
# The emulated systemd: a simulated host has no systemd (its PID 1 is sshd), yet a tool installs and enables units
# on a real Spark; boot.sh has `systemctl __boot` start the enabled ones, as systemd does at boot.
SYSTEMD = ("systemctl", "sim-systemd-unit", "sim-systemd-runner")
# The host's own units only: the real machine's enabled units (its lower layer) must not start in a simulated one.
UNIT_DIR = "/etc/systemd/system"


def seed_disk(state: ClusterState, host: HostSpec, host_dir: Path) -> None:
    """Files the host's hardware provides, written into its upper layer before every boot (a reset
    disk gets them back); stale /tmp is dropped, as a real boot clears it."""
    hd = host_dir
    upper = hd / "upper"
    shutil.rmtree(upper / "tmp", ignore_errors=True)
    settings = state.hardware.get(host.name, {})
    for path, content in hardware_files(state, host).items():
        machine.write_into_upper(upper, "/" + path, content.encode(), 0o644)
    machine.write_into_upper(upper, "/" + hardware.SPEEDS, hardware.speeds_file(host).encode(), 0o644)
    shutil.rmtree(hd / "sys-dmi", ignore_errors=True)
    hardware.write_dmi_tree(settings, hd / "sys-dmi")
    (hd / "meminfo").unlink(missing_ok=True)
    if "cma_total_kb" in settings:
        (hd / "meminfo").write_text(hardware.meminfo(Path("/proc/meminfo").read_text(), int(settings["cma_total_kb"])))
    for tool in (*hardware.EMULATORS, *SYSTEMD):
        machine.write_into_upper(upper, f"/usr/local/bin/{tool}", (HOST_FILES / tool).read_bytes(), 0o755)
    machine.opaque_dir_in_upper(upper, UNIT_DIR)
    # The host's identity where a real sshd keeps it (the machine's own keys sit in the lower layer).
    for name, mode in (("ssh_host_ed25519_key", 0o600), ("ssh_host_ed25519_key.pub", 0o644)):
        machine.write_into_upper(upper, f"/etc/ssh/{name}", (hd / name).read_bytes(), mode)
    ib = hd / "sys-infiniband"
    shutil.rmtree(ib, ignore_errors=True)
    ib.mkdir()
    hardware.write_infiniband_tree(host, ib, ipv4_gids=state.fabric_addresses,
                                   pcie_width=settings.get("pcie_width"))


def hardware_files(state: ClusterState, host: HostSpec) -> dict[str, str]:
    settings = state.hardware.get(host.name, {})
    files = {hardware.HARDWARE_JSON: hardware.hardware_json(state.name, host, settings),
             hardware.FIRMWARE_FILE: str(settings.get("firmware", hardware.DEFAULT_FIRMWARE)) + "\n"}
    if "kernel" in settings:
        files[hardware.KERNEL_FILE] = str(settings["kernel"]) + "\n"
    return files
