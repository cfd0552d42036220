"""Nodes compared with each other, and values known to break a Spark cluster, as findings that name the node
and the fix (pure: facts and NodeHealth in, findings out).

A cluster serves only as well as its least alike node: an image rebuilt on one node with another NCCL breaks a
ring that worked; a BIOS from before April 2026 wires the second ConnectX at PCIe Gen5 x2; kernel
7.0.0-1019-nvidia boots with `CmaTotal: 0 kB`, and then `ibv_reg_mr` fails for any size.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date

from ..engine.facts import HostFacts
from .health import NodeHealth


class Severity(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    group: str  # "preflight", "parity", "known issues"
    check: str
    severity: Severity
    summary: str
    fix: str = ""
    nodes: tuple[str, ...] = ()  # the nodes named (those that differ, or carry the bad value)
    values: dict[str, str] = field(default_factory=dict)  # node -> its value, where comparing says something


@dataclass(frozen=True)
class Node:
    facts: HostFacts
    health: NodeHealth


BAD_CMA_KERNEL = "7.0.0-1019-nvidia"
BIOS_X4_FIXED = date(2026, 4, 1)  # BIOS releases from April 2026 wire the second ConnectX at Gen5 x4
UPGRADE = "sudo apt update && sudo apt full-upgrade, then reboot"
FWUPD = "sudo fwupdmgr refresh && sudo fwupdmgr update, then reboot (DGX OS delivers BIOS and ConnectX firmware so)"


def _pcie(n: Node) -> str | None:
    """`4 twins at 32.0 GT/s PCIe x4`, or each twin when they differ."""
    links = sorted(n.facts.pcie_links, key=lambda l: l.netdev)
    shapes = {f"{l.speed.replace('_', ' ')} x{l.width}" for l in links}
    if len(shapes) == 1:
        return f"{len(links)} twins at {shapes.pop()}"
    return ", ".join(f"{l.netdev} {l.speed.replace('_', ' ')} x{l.width}" for l in links) or None


def _bios(n: Node) -> str | None:
    h = n.health
    return f"{h.bios_version} ({h.bios_date})" if h.bios_version and h.bios_date else h.bios_version


def _firmware(n: Node) -> str | None:
    return ", ".join(sorted(set(n.health.firmware.values()))) or None


def _nccl_conf(n: Node) -> str:
    files = [*(c.path for c in n.health.nccl_conf), *(["image:/etc/nccl.conf"] if n.health.image.nccl_conf else [])]
    return ", ".join(files) or "none"


def _cma(n: Node) -> str | None:
    return None if n.health.cma_total_kb is None else f"{n.health.cma_total_kb} kB"


# (check, how a node's value reads, severity when nodes differ, fix)
PARITY: tuple[tuple[str, Callable[[Node], str | None], Severity, str], ...] = (
    ("driver", lambda n: n.facts.gpu.driver_version if n.facts.gpu else None, Severity.FAIL,
     f"install the same NVIDIA driver on every node: {UPGRADE} on the one behind"),
    ("kernel", lambda n: n.facts.kernel or None, Severity.FAIL,
     f"boot the same kernel everywhere: {UPGRADE} on the one behind (or pick the kernel in GRUB)"),
    ("CUDA", lambda n: n.health.cuda, Severity.FAIL, f"the CUDA version follows the driver: {UPGRADE}"),
    ("OS release", lambda n: " / ".join(x for x in (n.facts.os, n.health.dgx_release) if x) or None, Severity.WARN,
     f"bring every node to the same DGX OS release: {UPGRADE}"),
    ("BIOS", _bios, Severity.FAIL, f"update the BIOS on the node behind: {FWUPD}"),
    ("ConnectX firmware", _firmware, Severity.FAIL, f"update the ConnectX firmware on the node behind: {FWUPD}"),
    ("PCIe link of the twins", _pcie, Severity.FAIL,
     "a twin that negotiated less than the others carries less: see the known issues below for why"),
    ("image ID", lambda n: (n.health.image.id or "")[:19] or None, Severity.FAIL,
     "run one image everywhere: `sparkcluster image sync` copies the head's image to the others"),
    ("NCCL in the image", lambda n: n.health.image.nccl, Severity.FAIL,
     "an image rebuilt on one node brought another NCCL: rebuild it once and `sparkcluster image sync`"),
    ("vLLM in the image", lambda n: n.health.image.vllm, Severity.FAIL,
     "an image rebuilt on one node brought another vLLM: rebuild it once and `sparkcluster image sync`"),
    ("host NCCL", lambda n: n.health.host_nccl, Severity.WARN,
     "install the same libnccl2 on every node (sudo apt install libnccl2=VERSION), or remove it where unused"),
    ("CmaTotal", _cma, Severity.FAIL, "boot the same kernel everywhere (CMA is the kernel's)"),
    ("memlock limit", lambda n: n.health.memlock, Severity.WARN,
     "set the same limit everywhere: `* - memlock unlimited` in /etc/security/limits.d/rdma.conf, then log in again"),
    ("NCCL config files", _nccl_conf, Severity.FAIL, "remove the leftover file: see the known issues below"),
)


def _nodes_against_majority(values: Mapping[str, str]) -> tuple[str, ...]:
    """The nodes whose value is not the most common one; every node when no value is the majority."""
    counts = Counter(values.values())
    top, top_count = counts.most_common(1)[0]
    if list(counts.values()).count(top_count) > 1:
        return tuple(values)  # a tie (two nodes, two values): nothing says which one is right
    return tuple(n for n, v in values.items() if v != top)


IMAGE_CHECKS = ("image ID", "NCCL in the image", "vLLM in the image")


def parity(nodes: Mapping[str, Node]) -> list[Finding]:
    findings = []
    no_image = all(not n.health.image.name for n in nodes.values())
    for check, read, severity, fix in PARITY:
        if no_image and check in IMAGE_CHECKS:
            continue
        values = {name: read(n) or "unknown" for name, n in nodes.items()}
        if len(nodes) < 2 or len(set(values.values())) == 1:
            findings.append(Finding("parity", check, Severity.OK, f"same on every node: {next(iter(values.values()))}",
                                    values=values))
            continue
        odd = _nodes_against_majority(values)
        listing = "; ".join(f"{n}: {values[n]}" for n in odd)
        others = [n for n in values if n not in odd]
        against = f" (the others: {values[others[0]]})" if others else ""
        findings.append(Finding("parity", check, severity, f"{', '.join(odd)} differ{'s' if len(odd) == 1 else ''}: "
                                f"{listing}{against}", fix, odd, values))
    return findings


BIOS_DATE = re.compile(r"^(\d{1,2})/(\d{1,2})/(\d{4})$")


def bios_date(text: str | None) -> date | None:
    """The DMI table's MM/DD/YYYY."""
    m = BIOS_DATE.match((text or "").strip())
    return date(int(m[3]), int(m[1]), int(m[2])) if m else None


def known_issues(name: str, n: Node, host_runtime: bool = False) -> list[Finding]:
    """`host_runtime`: Ray and vLLM run from a Python environment on the host (no container sets their limits)."""
    found = []
    h = n.health
    if h.cma_total_kb == 0:
        cause = f"kernel {n.facts.kernel} " if n.facts.kernel else ""
        found.append(Finding(
            "known issues", "CMA", Severity.FAIL,
            f"{name}: {cause}booted with CmaTotal: 0 kB: ibv_reg_mr fails even for 1 KB, so NCCL cannot register "
            "memory for RDMA (init fails or falls back to sockets)",
            f"boot a kernel with CMA: pick the previous DGX OS kernel in GRUB's advanced options, or {UPGRADE} to a "
            "kernel after 7.0.0-1019-nvidia; `grep CmaTotal /proc/meminfo` must be above 0", (name,)))
    elif n.facts.kernel == BAD_CMA_KERNEL and h.cma_total_kb is None:
        found.append(Finding("known issues", "CMA", Severity.WARN,
                             f"{name}: kernel {BAD_CMA_KERNEL} is known to boot with CmaTotal: 0 kB, and "
                             "/proc/meminfo shows no CmaTotal here", f"check `grep Cma /proc/meminfo`; {UPGRADE}",
                             (name,)))
    released = bios_date(h.bios_date)
    narrow = [l for l in n.facts.pcie_links if l.degraded]
    if narrow:
        links = ", ".join(f"{l.netdev} at {l.speed.replace('_', ' ')} x{l.width} of x{l.max_width}" for l in narrow)
        if released is None or released < BIOS_X4_FIXED:
            bios = f"BIOS {h.bios_version or '?'} of {h.bios_date or 'unknown date'}"
            found.append(Finding(
                "known issues", "PCIe", Severity.FAIL,
                f"{name}: {links}: a {bios} (before April 2026) wires the second ConnectX at PCIe Gen5 x2, so "
                "that twin runs at a fraction of its speed", f"update the BIOS: {FWUPD}", (name,)))
        else:
            found.append(Finding(
                "known issues", "PCIe", Severity.FAIL,
                f"{name}: {links}, although the BIOS ({h.bios_date}) wires it at x4: a slot short of power after a "
                "hot re-plug negotiates less", "reboot the node (a ConnectX re-plugged while on stays degraded)",
                (name,)))
    for conf in h.nccl_conf:
        found.append(Finding(
            "known issues", "nccl.conf", Severity.FAIL,
            f"{name}: {conf.path} sets {', '.join(l for l in conf.lines if '=' in l) or 'nothing'}: NCCL reads it "
            "under every job, whatever the comm env says (a leftover can freeze the first collective)",
            f"remove it (sudo rm {conf.path}) and put what it must set into the inventory", (name,)))
    if h.image.nccl_conf:
        found.append(Finding(
            "known issues", "nccl.conf", Severity.FAIL,
            f"{name}: image {h.image.name} carries /etc/nccl.conf ({', '.join(h.image.nccl_conf)}): NCCL reads it in "
            "every container (a leftover can freeze the first collective)",
            "rebuild the image without /etc/nccl.conf (RUN rm -f /etc/nccl.conf), then `sparkcluster image sync`",
            (name,)))
    if h.nccl_env:
        found.append(Finding(
            "known issues", "NCCL_* outside the comm env", Severity.WARN,
            f"{name}: {'; '.join(h.nccl_env)}: set outside sparkcluster's comm env, so what runs by hand (and any "
            "shell that reads these files) differs from what serve and verify use",
            "remove these settings, or put them into the inventory so every node gets them", (name,)))
    if host_runtime and h.memlock is not None and h.memlock != "unlimited":
        found.append(Finding(
            "known issues", "memlock", Severity.WARN,
            f"{name}: the login shell may lock only {h.memlock} KiB (ulimit -l): NCCL in vLLM run from the host "
            "may fail to register memory for RDMA",
            "`* - memlock unlimited` in /etc/security/limits.d/rdma.conf, then log in again", (name,)))
    if h.image.error:
        found.append(Finding("known issues", "image", Severity.WARN if h.image.id else Severity.FAIL,
                             f"{name}: {h.image.error}",
                             "build or pull it on the head, then `sparkcluster image sync` (or name it with --image)",
                             (name,)))
    return found
