"""Nodes and measured links for the NCCL verify tests: a node's facts and a probe's measured line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sparkcluster.engine.facts import HostFacts, Interface, RdmaDevice, parse_probe
from sparkcluster.nccl.links import LinkMeasure, link_probes
from sparkcluster.node.fabric import End, Fabric, Link

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TWINS = {0: ("enp1s0f0np0", "enP2p1s0f0np0"), 1: ("enp1s0f1np1", "enP2p1s0f1np1")}
HCAS = {"enp1s0f0np0": "rocep1s0f0", "enP2p1s0f0np0": "roceP2p1s0f0",
        "enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}


def node(index: int, ports: set[int], ipv4: dict[str, str]) -> HostFacts:
    """A Spark whose `ports` are cabled (their twins Up), the management LAN on 192.168.1.0/24, `ipv4` per twin."""
    base = parse_probe((FIXTURES / "probe-spark.txt").read_text())
    rdma = tuple(RdmaDevice(HCAS[n], 1, n, p in ports) for p in (0, 1) for n in TWINS[p])
    interfaces = [Interface("enP7s7", "UP", 1500, (f"192.168.1.{10 + index}/24",), 10000)]
    interfaces += [Interface(n, "UP" if p in ports else "DOWN", 9000, (ipv4[n],) if n in ipv4 else (), 200000)
                   for p in (0, 1) for n in TWINS[p]]
    return replace(base, rdma=rdma, interfaces=tuple(interfaces))

RING = ["spark-1", "spark-2", "spark-3"]


def ring3() -> tuple[Fabric, dict]:
    """Cable i joins spark-(i+1) port 0 to the next node's port 1, twin t on 10.0.(2i+t).0/24."""
    links, ipv4 = [], {n: {} for n in RING}
    for i, a in enumerate(RING):
        b = RING[(i + 1) % 3]
        for t in (0, 1):
            ea, eb = End(a, 0, TWINS[0][t]), End(b, 1, TWINS[1][t])
            ipv4[a][ea.netdev] = f"10.0.{2 * i + t}.{RING.index(a) + 1}/24"
            ipv4[b][eb.netdev] = f"10.0.{2 * i + t}.{RING.index(b) + 1}/24"
            first, second = sorted((ea, eb), key=lambda e: RING.index(e.node))
            links.append(Link(first, second, 200000))
    facts = {n: node(i, {0, 1}, ipv4[n]) for i, n in enumerate(RING, start=1)}
    return Fabric(tuple(RING), tuple(links)), facts


def measured(busbws: list[float | None]) -> list[LinkMeasure]:
    fabric, facts = ring3()
    probes, _ = link_probes(fabric, facts)
    return [LinkMeasure(p, b, "" if b else "the probe failed on spark-3 (exit 1)") for p, b in zip(probes, busbws)]
