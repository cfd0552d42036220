"""A node's pending upgrades as the platform table reads them: what apt would install (`apt-get -s dist-upgrade`) and
what fwupd offers (`fwupdmgr get-updates --json`), as candidates (a kernel, an NVIDIA driver, ConnectX firmware, a
BIOS), each matched against the known-bad table (platform_known.py) before anyone upgrades.

`dist-upgrade` and not `apt list --upgradable`: a new kernel is a new package (linux-image-7.0.0-1019-nvidia) that a
meta package pulls in, so the upgradable list shows only the meta's version, while the simulation's `Inst` lines name
the kernel itself. A candidate has not booted, so it is named for its version alone (the table's `shows` symptom is
what to watch for once it is installed)."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import re
from dataclasses import dataclass
from datetime import date, datetime, timezone

from . import platform_known
from .platform_known import KNOWN_BAD, Component, KnownBad, matches

# `Inst NAME [OLD] (NEW RELEASE [ARCH])`; [OLD] only where the package is installed already
_INST = re.compile(r"Inst (\S+)(?: \[([^\]]+)\])? \((\S+)")
_KERNEL = re.compile(r"linux-image-(?:unsigned-)?(\d[\w.+~-]*)")  # a kernel release, not a meta package
_KERNEL_META = re.compile(r"linux-(?:image-|headers-)?(?:[a-z]+-)*(?:hwe|generic|nvidia)[\w.-]*")
_DRIVER = re.compile(r"(?:nvidia-driver|nvidia-dkms|nvidia-kernel-common|nvidia-utils|libnvidia-compute)-\d+[\w-]*")


@dataclass(frozen=True)
class Candidate:
    """One upgrade a node would take: the component and its value as the table matches it (a kernel release, a driver
    version, a firmware version), the package or device that brings it, and what it replaces (None: new)."""

    component: Component
    value: str
    package: str  # an apt package, or a fwupd device's name
    version: str  # as apt or fwupd gives it
    replaces: str | None = None
    released: date | None = None  # a BIOS's release date (the table holds old BIOSes by date)

    def describe(self) -> str:
        source = f"{self.package} {self.version}" + (f", from {self.replaces}" if self.replaces else ", new")
        return f"{self.component.value} {self.value} ({source})"


@dataclass(frozen=True)
class Held:
    """A candidate the table holds back, and the table's line that does."""

    candidate: Candidate
    entry: KnownBad
    line: int  # of the entry in node/platform_known.py

    @property
    def where(self) -> str:
        return f"node/platform_known.py:{self.line}"


def upstream(version: str) -> str:
    """A Debian version's upstream part: `1:580.173.02-0ubuntu0.24.04.1` -> `580.173.02`."""
    return version.split(":", 1)[-1].split("-", 1)[0]


def parse_apt_simulation(text: str) -> tuple[tuple[Candidate, ...], tuple[str, ...]]:
    """Kernel and driver candidates from `apt-get -s dist-upgrade`'s Inst lines (one per component and value), and
    the kernel meta packages it would upgrade (what pulls a new kernel in: what to hold)."""
    found: dict[tuple[Component, str], Candidate] = {}
    metas: list[str] = []
    for line in text.splitlines():
        match = _INST.match(line.strip())
        if match is None:
            continue
        name, old, new = match.groups()
        kernel = _KERNEL.fullmatch(name)
        if kernel is not None:
            found.setdefault((Component.KERNEL, kernel.group(1)),
                             Candidate(Component.KERNEL, kernel.group(1), name, new, old))
        elif _DRIVER.fullmatch(name):
            found.setdefault((Component.DRIVER, upstream(new)), Candidate(Component.DRIVER, upstream(new), name, new, old))
        elif old is not None and _KERNEL_META.fullmatch(name):
            metas.append(name)
    return tuple(found.values()), tuple(metas)


def parse_fwupd_updates(text: str) -> tuple[Candidate, ...]:
    """ConnectX firmware and BIOS candidates from `fwupdmgr get-updates --json` (each device's newest release). Not
    JSON (fwupd says in words that there is nothing to update): none."""
    try:
        doc = json.loads(text)
    except ValueError:
        return ()
    devices = doc.get("Devices", []) if isinstance(doc, dict) else []
    found: list[Candidate] = []
    for device in devices if isinstance(devices, list) else []:
        releases = device.get("Releases") if isinstance(device, dict) else None
        if not releases or not isinstance(releases, list) or not isinstance(releases[0], dict):
            continue
        release = releases[0]
        version = str(release.get("Version", ""))
        name = str(device.get("Name", ""))
        words = " ".join(str(device.get(k, "")) for k in ("Name", "Vendor", "Plugin")).lower()
        current = str(device["Version"]) if device.get("Version") else None
        if "connectx" in words or "mellanox" in words:
            found.append(Candidate(Component.FIRMWARE, version, name, version, current))
        elif device.get("Plugin") == "uefi_capsule" or "system firmware" in words or "bios" in words:
            created = release.get("Created")
            released = (datetime.fromtimestamp(created, timezone.utc).date()
                        if isinstance(created, int | float) else None)
            found.append(Candidate(Component.BIOS, version, name, version, current, released))
    return tuple(found)


@functools.cache
def table_lines() -> tuple[int, ...]:
    """The line of each KNOWN_BAD entry in platform_known.py, in the table's order (read from its source)."""
    tree = ast.parse(inspect.getsource(platform_known))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Tuple):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "KNOWN_BAD" for t in targets):
                return tuple(element.lineno for element in node.value.elts)
    return ()


def held_back(candidates: tuple[Candidate, ...], table: tuple[KnownBad, ...] = KNOWN_BAD) -> tuple[Held, ...]:
    """Every candidate the table holds, with each entry that does (by version alone: nothing has booted it yet). A
    BIOS is listed but never held: the table holds BIOSes older than a date, and a pending one replaces an older one
    still, so holding it back would keep the worse."""
    lines = table_lines() if table is KNOWN_BAD else ()
    out: list[Held] = []
    for candidate in candidates:
        if candidate.component is Component.BIOS:
            continue
        for entry in matches(candidate.component, candidate.value, candidate.released, table):
            index = next(i for i, k in enumerate(table) if k is entry)
            out.append(Held(candidate, entry, lines[index] if index < len(lines) else 0))
    return tuple(out)
