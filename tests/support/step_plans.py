"""The step plans' cases as data (facts, scripted outputs, the exact plan) and the world they run in."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkcluster.engine.facts import parse_probe
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.engine.steps import HostContext
from sparkcluster.node import steps as _node_steps  # noqa: F401 (registers the node's steps)
from tests.support.strict_transport import StrictTransport

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STEP_CASES = FIXTURES / "steps"


# ---- loading the cases ---------------------------------------------------------------------------------
def load_cases() -> Iterator[Any]:
    for path in sorted(STEP_CASES.glob("*.json")):
        doc = json.loads(path.read_text())
        for case in doc["cases"]:
            case = {**case, "_probes": doc.get("probes", {}), "_file": path.name}
            # A case that pins a known defect: it must fail until the step is fixed (then drop `xfail`).
            marks = [pytest.mark.xfail(reason=case["xfail"], strict=True)] if "xfail" in case else []
            yield pytest.param(case, id=f"{path.stem}:{case['step']}:{case['id']}", marks=marks)


CASES = list(load_cases())


def text_of(spec: dict[str, Any]) -> bytes:
    if "lines" in spec:
        return "".join(line + "\n" for line in spec["lines"]).encode()
    return spec["text"].encode()


def probe_text(name: str, probes: dict[str, Any], edits: list[list[str]]) -> str:
    """A probe capture (a file under tests/fixtures or a named variant of one), edited; every edit must apply."""
    if name in probes:
        variant = probes[name]
        return probe_text(variant["file"], probes, [*variant.get("replace", []), *edits])
    text = (FIXTURES / name).read_text()
    for old, new in edits:
        assert old in text, f"stale fixture: {old!r} is not in {name}"
        text = text.replace(old, new)
    return text


def script(transport: StrictTransport, runs: list[dict[str, Any]]) -> None:
    for run in runs:
        match = re.compile(run["regex"]) if "regex" in run else run["line"]
        transport.expect(match, exit_code=run.get("exit_code", 0), stdout=run.get("stdout", ""),
                         stderr=run.get("stderr", ""), timed_out=run.get("timed_out", False), stdin=run.get("stdin"))


class World:
    """The inventory, facts and strict transports of one case."""

    def __init__(self, case: dict[str, Any]) -> None:
        given = case.get("given", {})
        nodes = given.get("hosts") or [{"name": "spark-1", "role": "head", **given}]
        hosts, self.facts, self.transports = [], {}, {}
        for i, node in enumerate(nodes, start=1):
            pins = node.get("pins", {})
            host = Host(name=node["name"], address=f"10.0.0.{i}", role=node.get("role", "worker"),
                        user=node.get("user", "spark"), qsfp_interface=pins.get("qsfp_interface"),
                        fabric_ip=pins.get("fabric_ip"), hcas=tuple(pins.get("hcas", ())))
            hosts.append(host)
            if node.get("probe", "probe-spark.txt") is not None:
                text = probe_text(node.get("probe", "probe-spark.txt"), case["_probes"], node.get("probe_replace", []))
                self.facts[host.name] = parse_probe(text)
            transport = StrictTransport(host.name, host_key=tuple(node.get("host_key", ("ssh-ed25519", f"KEY-{host.name}"))))
            for path, spec in node.get("files", {}).items():
                transport.put_file(path, text_of(spec), int(spec.get("mode", "0644"), 8),
                                   readable=spec.get("readable", True))
            script(transport, node.get("run", []))
            self.transports[host.name] = transport
        self.inventory = Inventory(path=Path("inv.yml"), name="t", hosts=tuple(hosts), vars={})
        self.on = next(h for h in hosts if h.name == given.get("on", hosts[0].name))
        self.nodes = {n["name"]: n for n in nodes}

    def context(self) -> HostContext:
        return HostContext(self.on, Session(self.inventory, self.transports, dict(self.facts)))  # type: ignore[arg-type]
