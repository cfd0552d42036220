"""Platform values known to break a Spark cluster, as data: kernel, driver, ConnectX firmware and BIOS versions,
each with the symptom owners saw, the fix that worked and the threads where they reported it.

doctor, top and receipts read this one table (`matches`); a value is matched by a shell-style pattern
(`fnmatch`), a BIOS by its release date. Where a bad value bites only with a symptom the node can show
(`Symptom`), the reader names it by that symptom: a kernel that booted with CMA, or a driver whose kernel log is
clean, is not flagged for its version alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import date
from fnmatch import fnmatchcase

from .finding import Severity


class Component(enum.Enum):
    KERNEL = "kernel"
    DRIVER = "driver"
    FIRMWARE = "ConnectX firmware"
    BIOS = "BIOS"


class Symptom(enum.Enum):
    """What the node shows when the bad value bites."""
    CMA_ZERO = "CmaTotal: 0 kB (or CmaFree above CmaTotal) in /proc/meminfo"
    TWIN_NARROW = "a ConnectX twin at PCIe x2 of x4"
    NV_NO_MEMORY = "NVRM NV_ERR_NO_MEMORY in the kernel log"


@dataclass(frozen=True)
class KnownBad:
    component: Component
    versions: tuple[str, ...]  # fnmatch patterns over the value as the node prints it (firmware: its first word)
    severity: Severity
    symptom: str
    fix: str
    sources: tuple[str, ...]  # owner/repo#N (issues), "PR #N" for pull requests, as the threads are named
    shows: Symptom | None = None  # named only where the node shows this; None: the version alone is enough
    released_before: date | None = None  # BIOS: every release before this date

    @property
    def source(self) -> str:
        return "; ".join(self.sources)

    def matches(self, value: str | None, released: date | None = None) -> bool:
        if self.released_before is not None:
            return released is not None and released < self.released_before
        word = (value or "").split(" ")[0]  # "28.45.4028 (NVD0000000033)": the version, not the PSID
        return bool(word) and any(fnmatchcase(word, pattern) for pattern in self.versions)


GRUB_KHO_OFF = ("add `kho=off` to the kernel command line: in /etc/default/grub append it to "
                "GRUB_CMDLINE_LINUX_DEFAULT (e.g. GRUB_CMDLINE_LINUX_DEFAULT=\"quiet splash kho=off\"), run "
                "`sudo update-grub` and reboot; then `cat /proc/cmdline` shows kho=off and `grep Cma /proc/meminfo` "
                "shows CmaTotal above 0 and CmaFree no larger than it (or boot 6.17.0-1032-nvidia from GRUB's "
                "advanced options)")
CMA_SYMPTOM = ("boots with CmaTotal: 0 kB while CmaFree reads above it (\"CmaFree > CmaTotal is the whole giveaway\"): "
               "ibv_reg_mr fails with ENOMEM for any size, so NCCL cannot register memory for RDMA (init fails, or "
               "falls back to sockets); kho=off also brought idle MemFree from 88 to 114 GiB")
CMA_SOURCES = ("MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259", "MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks#14",
               "eugr/spark-vllm-docker#389", "eugr/spark-vllm-docker#392")
FWUPD = "sudo fwupdmgr refresh && sudo fwupdmgr update, then reboot (DGX OS delivers BIOS and ConnectX firmware so)"
DRIVER_RELOAD = "sudo rmmod mlx5_ib mlx5_core; sudo modprobe mlx5_core"

KNOWN_BAD: tuple[KnownBad, ...] = (
    KnownBad(Component.KERNEL, ("7.0.0-1019-nvidia",), Severity.FAIL, CMA_SYMPTOM, GRUB_KHO_OFF, CMA_SOURCES,
             shows=Symptom.CMA_ZERO),
    KnownBad(Component.KERNEL, ("7.0.0-31-*",), Severity.FAIL, f"the HWE kernel {CMA_SYMPTOM}", GRUB_KHO_OFF,
             CMA_SOURCES, shows=Symptom.CMA_ZERO),
    KnownBad(Component.BIOS, (), Severity.FAIL,
             "a BIOS released before April 2026 wires the second ConnectX at PCIe Gen5 x2, so that twin runs at a "
             "fraction of its speed", f"update the BIOS: {FWUPD}",
             ("tonyd2wild/DeepSeek-v4-Flash-…-2x-DGX-Spark PR #35", "graham33/nixos-dgx-spark#35"),
             shows=Symptom.TWIN_NARROW, released_before=date(2026, 4, 1)),
    KnownBad(Component.FIRMWARE, ("28.45.4028",), Severity.WARN,
             "reported initialising degraded: link at 200G and PCIe Gen5 x4, yet about 13 Gb/s over TCP and RDMA",
             f"`sparkcluster verify` measures each twin; one far below its peers needs the driver reloaded "
             f"({DRIVER_RELOAD}) or a power cycle with AC removed; then update the firmware: {FWUPD}",
             ("NVIDIA/dgx-spark-playbooks PR #108",)),
    KnownBad(Component.DRIVER, ("580.173.02", "595.84"), Severity.WARN,
             "reported wedging the whole host under sustained unified-memory pressure once NVRM logs NV_ERR_NO_MEMORY "
             "(no OOM kill, no panic, empty pstore; 1 of 3 units stopped 14 times in 4 days)",
             "leave unified memory headroom: a lower vLLM --gpu-memory-utilization (or a shorter --max-model-len); a "
             "wedged node comes back only with a power cycle",
             ("NVIDIA/open-gpu-kernel-modules#1358",), shows=Symptom.NV_NO_MEMORY),
)


def matches(component: Component, value: str | None, released: date | None = None,
            table: tuple[KnownBad, ...] = KNOWN_BAD) -> tuple[KnownBad, ...]:
    """The table's entries that `value` (or, for a BIOS, its release date) lands on."""
    return tuple(k for k in table if k.component is component and k.matches(value, released))
