"""A node's last good state, saved and compared: `doctor --save-baseline FILE` records each node's versions (kernel,
driver, BIOS, ConnectX firmware, NCCL, CUDA, DGX OS), limits (memlock, CMA) and health figures (memory, the last
verify's busbw per group, twin and link) as a typed, versioned JSON; `doctor --baseline FILE` names everything that
changed since, per node, old and new. A change fails where it lands on a known-bad value (node/platform_known.py)
or where a figure fell (busbw down more than BUSBW_DROP, CMA to 0): what an `apt upgrade` and a reboot can do to a
cluster that worked.

Pure apart from `read`/`write` (the file) and `last_verify_records` (one cat per node): the doctor's nodes in, a
Baseline out; two Baselines in, the changes out.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from ..engine.errors import UsageError
from ..engine.inventory import Host
from ..engine.localfiles import check_replaceable, read_json, replacing
from ..engine.nodetext import as_markup
from ..engine.session import Session
from ..nccl.lastverify import LAST_VERIFY_COMMAND
from ..node.parity import Node, bios_date
from ..node.platform_known import Component, KnownBad, matches

BASELINE_VERSION = 1
BUSBW_DROP = 0.10  # a busbw more than 10% under the baseline's fell; runs on one link spread a few percent
SAVE_FIX = "save one on a healthy cluster: `sparkcluster doctor --save-baseline FILE`"

# Each field's words, and what a change of it is judged against: a known-bad table component, or a rule.
VERSION, LIMIT, FIGURE = "version", "limit", "figure"


def _about(label: str, kind: str, component: Component | None = None) -> dict[str, Any]:
    return {"label": label, "kind": kind, "component": component}


@dataclass(frozen=True)
class NodeBaseline:
    kernel: str | None = field(default=None, metadata=_about("kernel", VERSION, Component.KERNEL))
    driver: str | None = field(default=None, metadata=_about("driver", VERSION, Component.DRIVER))
    bios: str | None = field(default=None, metadata=_about("BIOS", VERSION))
    bios_date: str | None = field(default=None, metadata=_about("BIOS date", VERSION, Component.BIOS))
    connectx_firmware: tuple[str, ...] = field(default=(), metadata=_about("ConnectX firmware", VERSION,
                                                                           Component.FIRMWARE))
    host_nccl: str | None = field(default=None, metadata=_about("host NCCL", VERSION))
    image_nccl: str | None = field(default=None, metadata=_about("NCCL in the image", VERSION))
    cuda: str | None = field(default=None, metadata=_about("CUDA", VERSION))
    dgx_os: str | None = field(default=None, metadata=_about("DGX OS", VERSION))
    memlock: str | None = field(default=None, metadata=_about("memlock limit", LIMIT))
    cma_total_kb: int | None = field(default=None, metadata=_about("CmaTotal kB", LIMIT))
    cma_free_kb: int | None = field(default=None, metadata=_about("CmaFree kB", FIGURE))
    mem_total_kb: int | None = field(default=None, metadata=_about("MemTotal kB", FIGURE))
    # "all": the whole collective of the last verify; "twin 0 (...)", "link ...": each alone (GB/s)
    busbw_gbps: dict[str, float] = field(default_factory=dict, metadata=_about("busbw", FIGURE))
    verified_at: str | None = field(default=None, metadata=_about("last verify", FIGURE))


@dataclass(frozen=True)
class Baseline:
    saved_at: str
    nodes: dict[str, NodeBaseline]
    version: int = BASELINE_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "saved_at": self.saved_at,
                "nodes": {name: asdict(n) for name, n in self.nodes.items()}}


@dataclass(frozen=True)
class Change:
    node: str
    what: str  # the field's label ("driver", "busbw twin 0 (...)")
    old: str
    new: str
    bad: str = ""  # why this change fails (a known-bad value, a figure that fell); "" when it is only news
    fix: str = ""
    source: str = ""  # where owners reported a known-bad value

    def to_json(self) -> dict[str, str]:
        return asdict(self)


# ---- from the doctor's nodes --------------------------------------------------------------------------------------
def node_baseline(node: Node, verify: Mapping[str, Any] | None) -> NodeBaseline:
    f, h = node.facts, node.health
    return NodeBaseline(
        kernel=f.kernel or None, driver=f.gpu.driver_version if f.gpu else None, bios=h.bios_version,
        bios_date=h.bios_date, connectx_firmware=tuple(sorted(set(h.firmware.values()))), host_nccl=h.host_nccl,
        image_nccl=h.image.nccl, cuda=h.cuda, dgx_os=h.dgx_release, memlock=h.memlock, cma_total_kb=h.cma_total_kb,
        cma_free_kb=h.cma_free_kb, mem_total_kb=h.mem_total_kb, busbw_gbps=busbw_of(verify or {}),
        verified_at=str(verify["at"]) if verify and isinstance(verify.get("at"), str) else None)


def busbw_of(record: Mapping[str, Any]) -> dict[str, float]:
    """The busbw a node's last-verify.json keeps: the whole collective's, each twin's and each link's alone."""
    out: dict[str, float] = {}
    if _number(record.get("busbw_gbps")):
        out["all"] = float(record["busbw_gbps"])
    for group in ("twins", "links"):
        alone = record.get(group)
        if isinstance(alone, dict):
            out.update({str(label): float(v) for label, v in alone.items() if _number(v)})
    return out


def _number(value: object) -> bool:
    """A positive figure a float holds (a 400-digit integer does not: arithmetic on it overflows)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and value > 0
    except OverflowError:
        return False


def last_verify_records(session: Session, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each node's last verify record (nccl/lastverify.py writes it on every node); empty where it never verified."""
    def read(host: Host) -> tuple[str, dict[str, Any]]:
        result = session.run(host, LAST_VERIFY_COMMAND)
        try:
            doc = json.loads(result.stdout) if result.ok else None
        except json.JSONDecodeError:
            doc = None
        return host.name, doc if isinstance(doc, dict) else {}
    return dict(session.each(read, [h for h in session.hosts if h.name in names]))


def baseline_of(nodes: Mapping[str, Node], records: Mapping[str, Mapping[str, Any]]) -> Baseline:
    return Baseline(datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    {name: node_baseline(n, records.get(name)) for name, n in nodes.items()})


# ---- compared -----------------------------------------------------------------------------------------------------
def _shown(value: object) -> str:
    if value is None or value == ():
        return "unknown"
    return ", ".join(value) if isinstance(value, tuple) else str(value)


def _known_bad(component: Component, value: object) -> KnownBad | None:
    if component is Component.BIOS:
        return next(iter(matches(component, None, bios_date(str(value)))), None)
    values = value if isinstance(value, tuple) else (value,)
    return next((k for v in values for k in matches(component, str(v))), None)


def _version_change(node: str, label: str, component: Component | None, old: object, new: object) -> Change:
    bad = _known_bad(component, new) if component is not None and new not in (None, ()) else None
    if bad is None:
        return Change(node, label, _shown(old), _shown(new))
    return Change(node, label, _shown(old), _shown(new), f"lands on a known-bad {component.value if component else label}"
                  f": {bad.symptom}", bad.fix, bad.source)


def _busbw_changes(node: str, old: Mapping[str, float], new: Mapping[str, float]) -> list[Change]:
    changes = []
    for key in sorted(old.keys() & new.keys()):
        before, now = old[key], new[key]
        if abs(now - before) < 0.005:
            continue
        fell = now < before * (1 - BUSBW_DROP)
        label = "busbw" if key == "all" else f"busbw {key}"
        changes.append(Change(node, label, f"{before:.2f} GB/s", f"{now:.2f} GB/s",
                              f"fell {100 * (1 - now / before):.0f}% (more than {BUSBW_DROP:.0%})" if fell else "",
                              "run `sparkcluster verify` again (one slow run is noise); if it stays low: `sparkcluster "
                              "doctor` names a kernel, driver or firmware that changed, a twin at PCIe x2 or kernel-log "
                              "errors; reload the ConnectX driver (sudo rmmod mlx5_ib mlx5_core; sudo modprobe "
                              "mlx5_core) or power-cycle the node" if fell else ""))
    return changes


def _cma_change(node: str, label: str, old: object, new: object) -> Change:
    if new == 0 and isinstance(old, int) and old > 0:
        return Change(node, label, _shown(old), "0", "CMA fell to 0: ibv_reg_mr fails for any size, NCCL cannot "
                      "register memory for RDMA", "add kho=off to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT in "
                      "/etc/default/grub, `sudo update-grub`, reboot), or boot the previous kernel from GRUB")
    return Change(node, label, _shown(old), _shown(new))


def compare(saved: Baseline, now: Baseline) -> list[Change]:
    """Everything that changed, node by node in the baseline's order; a node that is only in one of them is named."""
    changes: list[Change] = []
    for name, before in saved.nodes.items():
        after = now.nodes.get(name)
        if after is None:
            changes.append(Change(name, "node", "in the baseline", "not checked now (unreachable, or left the "
                                                                     "inventory)"))
            continue
        for f in fields(NodeBaseline):
            old, new = getattr(before, f.name), getattr(after, f.name)
            if old == new or f.name == "verified_at":
                continue
            label, kind = f.metadata["label"], f.metadata["kind"]
            if f.name == "busbw_gbps":
                changes += _busbw_changes(name, old, new)
            elif f.name == "cma_total_kb":
                changes.append(_cma_change(name, label, old, new))
            elif kind == VERSION:
                changes.append(_version_change(name, label, f.metadata["component"], old, new))
            else:
                changes.append(Change(name, label, _shown(old), _shown(new)))
    changes += [Change(name, "node", "not in the baseline", "checked now") for name in now.nodes
                if name not in saved.nodes]
    return changes


# ---- the file -----------------------------------------------------------------------------------------------------
def _node_from_json(name: str, doc: object, where: str) -> NodeBaseline:
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: node {name!r} is not an object", SAVE_FIX)
    known = {f.name: f for f in fields(NodeBaseline)}
    values: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in known:
            continue  # a field a later sparkcluster added within this version: ignored, not guessed at
        if key == "connectx_firmware":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            value = tuple(value) if ok else value
        elif key == "busbw_gbps":
            ok = isinstance(value, dict) and all(_number(v) for v in value.values())
        elif key in ("cma_total_kb", "cma_free_kb", "mem_total_kb"):
            ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
        else:
            ok = value is None or isinstance(value, str)
        if not ok:
            raise UsageError(f"{where}: node {name!r} has {key} = {value!r}, not the kind of value a baseline holds",
                             f"{SAVE_FIX} again (a hand-edited baseline must keep each field's type)")
        values[key] = value
    return NodeBaseline(**values)


def from_json(doc: object, where: str) -> Baseline:
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), dict):
        raise UsageError(f"{where}: not a sparkcluster baseline (no \"nodes\" object)", SAVE_FIX)
    version = doc.get("version")
    if version != BASELINE_VERSION:
        raise UsageError(f"{where}: baseline version {version!r}; this sparkcluster reads version {BASELINE_VERSION}",
                         f"{SAVE_FIX} with this sparkcluster (compare by hand against the old file first)")
    return Baseline(str(doc.get("saved_at", "unknown")),
                    {str(n): _node_from_json(str(n), d, where) for n, d in doc["nodes"].items()})


def read(text: str) -> Baseline:
    """A baseline file, checked before anything connects: a UsageError (exit 2) names what is wrong and the fix (a
    FIFO, a device, an endless or hostile file among them: engine/localfiles.py)."""
    doc = read_json(Path(text).expanduser(), f"--baseline {text}", "a sparkcluster baseline",
                    f"name the file --save-baseline wrote, or {SAVE_FIX}")
    return from_json(doc, text)


def writable(text: str) -> Path:
    """Where --save-baseline will write, checked before anything connects."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise UsageError(f"--save-baseline {text}: {path} is a folder", f"name a file in it, e.g. {path}/baseline.json")
    if not path.parent.is_dir():
        raise UsageError(f"--save-baseline {text}: no folder {path.parent}", "create it first, or name a file in an "
                                                                                  "existing one")
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"--save-baseline {text}: cannot write in {path.parent}", "name a file in a folder you can write")
    check_replaceable(path, f"--save-baseline {text}", _SAVE_AT)
    return path


_SAVE_AT = "name a regular file (a new one, or a baseline saved before), e.g. ~/baseline.json"


def write(baseline: Baseline, path: Path) -> None:
    """Atomically and never through a link (engine/localfiles.py): a reader (or a crash) sees the old baseline or
    the new one, never half of one."""
    with replacing(path, 0o644, f"--save-baseline {path}", _SAVE_AT) as f:
        f.write((json.dumps(baseline.to_json(), indent=2) + "\n").encode())




# ---- said ---------------------------------------------------------------------------------------------------------
def json_of(saved: Baseline | None, where: str | None, changes: list[Change], saved_to: Path | None) -> dict[str, Any]:
    """What --json adds: the comparison (where --baseline was given) and where the new baseline went."""
    out: dict[str, Any] = {}
    if saved is not None:
        out["baseline"] = {"file": where, "saved_at": saved.saved_at, "ok": not any(c.bad for c in changes),
                           "changes": [c.to_json() for c in changes]}
    if saved_to is not None:
        out["saved_baseline"] = str(saved_to)
    return out


def render(console: Console, saved: Baseline | None, where: str | None, changes: list[Change],
           current: Baseline | None, saved_to: Path | None) -> None:
    """After the doctor's table: each change per node, old -> new, a failing one with why and its fix."""
    nodes = len(current.nodes) if current else 0
    if saved is not None:
        console.print(f"[bold]since the baseline[/bold] {as_markup(where or '')} (saved {as_markup(saved.saved_at)})",
                      highlight=False)
        for c in changes:
            mark = "[red]FAIL[/red]" if c.bad else "    "
            console.print(f"  {mark} {as_markup(c.node)} {as_markup(c.what)}: {as_markup(c.old)} -> {as_markup(c.new)}"
                          + (f": {as_markup(c.bad)}" if c.bad else ""), highlight=False)
            if c.fix:
                console.print(f"         fix: {as_markup(c.fix)}", highlight=False)
            if c.source:
                console.print(f"         reported: {as_markup(c.source)}", highlight=False)
        failing = sum(bool(c.bad) for c in changes)
        touched = len({c.node for c in changes})
        console.print(f"baseline: {_count(len(changes), 'change')} on {_count(touched, 'node')}, {failing} failing"
                      if changes else f"baseline: nothing changed on {_count(nodes, 'node')}", highlight=False)
    if saved_to is not None:
        console.print(f"baseline: saved {_count(nodes, 'node')} to {as_markup(str(saved_to))}; after the next `apt upgrade` and "
                      f"reboot: sparkcluster doctor --baseline {as_markup(str(saved_to))}", highlight=False)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
