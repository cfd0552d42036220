"""Nodes compared with each other, and values known to break a Spark cluster, as findings that name the node
and the fix (pure: facts and NodeHealth in, findings out).

A cluster serves only as well as its least alike node: an image rebuilt on one node with another NCCL breaks a
ring that worked. The known-bad platform values (a kernel that boots with `CmaTotal: 0 kB`, a BIOS that wires the
second ConnectX at x2, ...) are the table in platform_known.py, read here with the symptom each shows.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date

from ..engine.facts import HostFacts
from .finding import Finding, Severity
from .health import NodeHealth
from .platform_known import GRUB_KHO_OFF, KNOWN_BAD, Component, KnownBad, Symptom, matches

__all__ = ["Finding", "Node", "Severity", "bios_date", "known_issues", "parity"]


@dataclass(frozen=True)
class Node:
    facts: HostFacts
    health: NodeHealth


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
    # A node without the image yet is told apart (the doctor warns how it gets there): the image checks compare
    # the nodes that hold one, and are left out where none does.
    holding = {name: n for name, n in nodes.items() if n.health.image.name and not n.health.image.absent}
    for check, read, severity, fix in PARITY:
        compared = holding if check in IMAGE_CHECKS else nodes
        if not compared:
            continue
        values = {name: read(n) or "unknown" for name, n in compared.items()}
        if len(compared) < 2 or len(set(values.values())) == 1:
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


def _cma_read(name: str, n: Node) -> list[Finding]:
    """CMA read against the kernel: CmaTotal 0, or CmaFree above CmaTotal (what kho breaks), names kho=off."""
    h, kernel = n.health, n.facts.kernel or None
    known = [k for k in matches(Component.KERNEL, kernel) if k.shows is Symptom.CMA_ZERO]
    source = known[0].source if known else ""
    free = "" if h.cma_free_kb is None else f", CmaFree: {h.cma_free_kb} kB"
    broken = h.cma_total_kb == 0 or (h.cma_total_kb is not None and (h.cma_free_kb or 0) > h.cma_total_kb)
    if broken:
        giveaway = (" (CmaFree > CmaTotal is the whole giveaway)"
                    if h.cma_free_kb is not None and h.cma_total_kb is not None and h.cma_free_kb > h.cma_total_kb
                    else "")
        cause = f"kernel {kernel} " if kernel else ""
        listed = "" if known or not kernel else f" (kernel {kernel} is not yet in the known-bad table)"
        fix = (GRUB_KHO_OFF if not h.kho_off else
               "kho=off is already on the kernel command line and CMA is still broken: boot 6.17.0-1032-nvidia from "
               f"GRUB's advanced options, or {UPGRADE} to a kernel after it")
        return [Finding(
            "known issues", "CMA", Severity.FAIL,
            f"{name}: {cause}booted with CmaTotal: {h.cma_total_kb} kB{free}{giveaway}: ibv_reg_mr fails even for "
            f"1 KB, so NCCL cannot register memory for RDMA (init fails with ENOMEM or falls back to sockets){listed}",
            fix, (name,), {name: f"CmaTotal {h.cma_total_kb} kB{free}"}, source)]
    if known and h.cma_total_kb is None:
        return [Finding("known issues", "CMA", Severity.WARN,
                        f"{name}: kernel {kernel} is known to boot with CmaTotal: 0 kB, and /proc/meminfo shows no "
                        "CmaTotal here", f"check `grep Cma /proc/meminfo`; if CmaTotal is 0: {GRUB_KHO_OFF}",
                        (name,), source=source)]
    return []  # CMA as it should be: a listed kernel booted with kho=off (or a build without the fault) is fine


def _version_only(name: str, n: Node) -> list[Finding]:
    """Entries of the table that a version alone is enough for (no symptom to wait for)."""
    values: dict[Component, list[str | None]] = {
        Component.KERNEL: [n.facts.kernel], Component.DRIVER: [n.facts.gpu.driver_version if n.facts.gpu else None],
        Component.FIRMWARE: [*sorted(set(n.health.firmware.values()))], Component.BIOS: [n.health.bios_version]}
    found = []
    for component, seen in values.items():
        for value in seen:
            for k in matches(component, value, bios_date(n.health.bios_date)):
                if k.shows is None:
                    found.append(Finding("known issues", f"known-bad {component.value}", k.severity,
                                         f"{name}: {component.value} {value}: {k.symptom}", k.fix, (name,),
                                         {name: str(value)}, k.source))
    return found


def _bios_narrow(h: NodeHealth) -> KnownBad | None:
    """The table's BIOS entry that explains a twin at x2, where the node's BIOS is older than its fix."""
    return next((k for k in KNOWN_BAD if k.component is Component.BIOS and k.shows is Symptom.TWIN_NARROW
                 and (k.matches(h.bios_version, bios_date(h.bios_date)) or bios_date(h.bios_date) is None)), None)


def known_issues(name: str, n: Node, host_runtime: bool = False) -> list[Finding]:
    """`host_runtime`: Ray and vLLM run from a Python environment on the host (no container sets their limits)."""
    found = _cma_read(name, n) + _version_only(name, n)
    h = n.health
    narrow = [l for l in n.facts.pcie_links if l.degraded]
    if narrow:
        links = ", ".join(f"{l.netdev} at {l.speed.replace('_', ' ')} x{l.width} of x{l.max_width}" for l in narrow)
        if old := _bios_narrow(h):
            bios = f"BIOS {h.bios_version or '?'} of {h.bios_date or 'unknown date'}"
            found.append(Finding(
                "known issues", "PCIe", Severity.FAIL,
                f"{name}: {links}: a {bios} (before April 2026) wires the second ConnectX at PCIe Gen5 x2, so "
                "that twin runs at a fraction of its speed", old.fix, (name,), source=old.source))
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
    if h.image.error and not h.image.absent:  # an image not there yet is the doctor's to judge, knowing the head's
        found.append(Finding("known issues", "image", Severity.WARN if h.image.id else Severity.FAIL,
                             f"{name}: {h.image.error}",
                             "build or pull it on the head, then `sparkcluster image sync` (or name it with --image)",
                             (name,)))
    return found
