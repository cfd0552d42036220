"""`doctor --upgrades`: every node's pending upgrades read (node/upgrades.py) and each candidate the known-bad table
holds named before anyone upgrades, with the table's line that holds it back, how to hold it, and the table's fix
should it land anyway. Reads only: apt simulates (`-s`, no lock, no root) and fwupd lists; neither refreshes its
metadata, so the answer is as of the node's last `apt-get update` / `fwupdmgr refresh`."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ..engine.command import Command
from ..engine.inventory import Host
from ..engine.session import Session
from ..node.finding import Finding, Severity
from ..node.platform_known import Component
from ..node.upgrades import Candidate, Held, held_back, parse_apt_simulation, parse_fwupd_updates

FWUPD_MARK = "@@sparkcluster-fwupd@@"
# One exec per node. LC_ALL=C: apt's words as parsed; Debug::NoLocking: a simulation needs no lock (nor root).
UPGRADES_SCRIPT = (
    "if command -v apt-get >/dev/null 2>&1; then LC_ALL=C apt-get -s -o Debug::NoLocking=1 dist-upgrade 2>&1 "
    "</dev/null; echo \"@@apt rc=$?\"; else echo '@@apt missing'; fi; "
    f"echo {FWUPD_MARK}; "
    "if command -v fwupdmgr >/dev/null 2>&1; then timeout 60 fwupdmgr get-updates --json --no-unreported-check "
    "--no-metadata-check </dev/null 2>/dev/null; echo \"@@fwupd rc=$?\"; else echo '@@fwupd missing'; fi")


@dataclass(frozen=True)
class NodeUpgrades:
    candidates: tuple[Candidate, ...] = ()
    held: tuple[Held, ...] = ()
    metas: tuple[str, ...] = ()  # kernel meta packages apt would upgrade (what pulls a new kernel in)
    unread: tuple[str, ...] = ()  # what could not be read, and why ("apt-get: not installed")


@dataclass(frozen=True)
class Upgrades:
    nodes: dict[str, NodeUpgrades] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for name, node in self.nodes.items():
            for held in node.held:
                out.append(held_finding(name, held, node.metas))
            for why in node.unread:
                out.append(Finding("upgrades", "pending", Severity.WARN, f"{name}: {why}", nodes=(name,)))
            if not node.held:
                pending = ", ".join(c.describe() for c in node.candidates) or "no kernel, driver or firmware upgrade"
                out.append(Finding("upgrades", "pending", Severity.OK, f"{name}: {pending}; none on the known-bad "
                                   "table", nodes=(name,)))
        for name, why in self.unreachable.items():
            out.append(Finding("upgrades", "pending", Severity.FAIL, f"{name}: not read: {why}", nodes=(name,)))
        return out

    def to_json(self) -> dict[str, Any]:
        def candidate(c: Candidate, node: NodeUpgrades) -> dict[str, Any]:
            holds = [h for h in node.held if h.candidate == c]
            return {"component": c.component.value, "value": c.value, "package": c.package, "version": c.version,
                    "replaces": c.replaces,
                    "held_back_by": [{"line": h.where, "severity": h.entry.severity.value,
                                      "versions": list(h.entry.versions), "symptom": h.entry.symptom,
                                      "fix": h.entry.fix, "source": h.entry.source} for h in holds]}
        return {"nodes": {name: {"candidates": [candidate(c, n) for c in n.candidates], "unread": list(n.unread)}
                          for name, n in self.nodes.items()},
                "unreachable": self.unreachable}


def hold_command(held: Held, metas: tuple[str, ...]) -> str:
    """What keeps the candidate off: the package itself and, for a kernel, the metas that would pull it in."""
    packages = [held.candidate.package, *(metas if held.candidate.component is Component.KERNEL else ())]
    return shlex.join(["sudo", "apt-mark", "hold", *packages])


def held_finding(node: str, held: Held, metas: tuple[str, ...]) -> Finding:
    c, entry = held.candidate, held.entry
    if c.component in (Component.KERNEL, Component.DRIVER):
        hold = f"do not upgrade it: `{hold_command(held, metas)}` before `apt upgrade`"
    else:
        hold = f"do not apply it: leave `fwupdmgr update` for {c.package} until a release past {c.value}"
    patterns = ", ".join(entry.versions) or f"released before {entry.released_before}"
    return Finding("upgrades", f"{c.component.value} {c.value}", entry.severity,
                   f"{node}: would install {c.describe()}, held back by {held.where} ({entry.component.value} "
                   f"{patterns}): {entry.symptom}",
                   f"{hold}; if it lands anyway: {entry.fix}", (node,), {node: c.value}, entry.source)


def parse_node(text: str) -> NodeUpgrades:
    apt_text, _, fwupd_text = text.partition(FWUPD_MARK)
    unread: list[str] = []
    candidates: tuple[Candidate, ...] = ()
    metas: tuple[str, ...] = ()
    if "@@apt missing" in apt_text:
        unread.append("apt-get is not installed: kernel and driver upgrades not read")
    elif "@@apt rc=0" not in apt_text:
        tail = [line for line in apt_text.splitlines() if line.strip() and not line.startswith("@@")][-1:]
        unread.append(f"`apt-get -s dist-upgrade` failed ({'; '.join(tail) or 'no output'}): kernel and driver "
                      "upgrades not read")
    else:
        candidates, metas = parse_apt_simulation(apt_text)
    if "@@fwupd missing" in fwupd_text:
        unread.append("fwupdmgr is not installed: firmware and BIOS updates not read")
    else:
        # exit 2 is fwupd's "nothing to do"; its JSON, where any, comes before the rc line
        candidates += parse_fwupd_updates(fwupd_text.split("@@fwupd rc=")[0])
    return NodeUpgrades(candidates, held_back(candidates), metas, tuple(unread))


def read_upgrades(session: Session, names: list[str]) -> Upgrades:
    """Every named (reachable) node's pending upgrades, read in parallel."""
    hosts = [h for h in session.hosts if h.name in names]

    def read(host: Host) -> NodeUpgrades | str:
        result = session.run(host, Command(UPGRADES_SCRIPT, timeout=180))
        if result.timed_out:
            return f"reading its pending upgrades timed out after {result.command.timeout:g} s"
        return parse_node(result.stdout)

    nodes: dict[str, NodeUpgrades] = {}
    unreachable: dict[str, str] = {}
    for host, got in zip(hosts, session.each(read, hosts)):
        if isinstance(got, str):
            unreachable[host.name] = got
        else:
            nodes[host.name] = got
    return Upgrades(nodes, unreachable)
