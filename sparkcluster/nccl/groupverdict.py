"""The whole group's run judged from its ranks' outputs: NCCL's own INFO lines on GPUs; on CPU (gloo, the simulated
cluster), the TCP connections each rank really held, whose addresses name the interface that carried the data."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.facts import HostFacts
from ..engine.inventory import Host
from ..engine.session import Session
from ..node.network import QsfpChoice
from .latency import over_field, read_latency, with_latency
from .logs import read_log, read_probe_output
from .rings import Endpoint
from .thresholds import floor_for
from .verdict import Verdict, VerdictStatus, judge
from .verifyresult import VerifyResult


def judge_probe(session: Session, backend: str, outputs: Mapping[str, str], choices: Mapping[str, QsfpChoice],
                min_busbw: float | None, topology: str | None = None, control_netdevs: set[str] | None = None
                ) -> VerifyResult:
    """The verdict from the ranks' outputs: NCCL's own log lines on GPUs, the connections each rank held on CPU."""
    text = "\n".join(outputs.values())
    rows, ranks = read_probe_output(text)
    latency = read_latency(text)
    carried = _carried_by(ranks, session.hosts, session.facts)
    # Real Sparks: the floor of this topology (thresholds.py); gloo on CPU has no link speed to hold.
    nodes = len(session.hosts)
    threshold = min_busbw if min_busbw is not None else (
        floor_for(topology, nodes).min_busbw_gbps if backend == "nccl" else None)
    if backend == "nccl":
        logs = [r for name, out in outputs.items() for r in read_log(out, name)]
        hcas = tuple(dict.fromkeys(hca for c in choices.values() for hca in c.hcas))
        verdict = judge(logs, expected_hcas=hcas, qsfp_interfaces=tuple({c.netdev for c in choices.values()}),
                        rows=rows, min_busbw_gbps=threshold, endpoints=endpoints(session.facts),
                        topology=topology)
        # Real Sparks have field figures to hold the group's latency to; the simulator's CPU gloo has none.
        verdict = with_latency(verdict, over_field(latency) if latency else None)
    else:
        verdict = _judge_connections(carried, choices, control_netdevs or set())
    return VerifyResult(backend, verdict, rows, carried, latency=latency)


def _carried_by(ranks: list[dict[str, Any]], hosts: Sequence[Host], facts: Mapping[str, HostFacts]
                ) -> dict[str, list[str]]:
    """Per node: the interface and addresses of each TCP connection its rank held to another node."""
    out: dict[str, list[str]] = {}
    names = [h.name for h in hosts]
    for rank in ranks:
        index = rank.get("rank")
        if not isinstance(index, int) or index >= len(names):
            continue
        name = names[index]
        lines = []
        for local, remote in rank.get("tcp", []):
            if local == remote or local.startswith("127.") or remote.startswith("127."):
                continue  # loopback: the rank talking to itself or to the local store
            iface = interface_of(facts[name], local) or _network_of(facts[name], remote) or "?"
            lines.append(f"{iface} {local} -> {remote}")
        out[name] = sorted(set(lines))
    return out


def _judge_connections(carried: Mapping[str, list[str]], choices: Mapping[str, QsfpChoice],
                       control_netdevs: set[str]) -> Verdict:
    """`control_netdevs`: on a ring, gloo binds one interface, the control plane's (every node reaches it): there
    the whole collective runs on it, and each link's own run (links.py) proves the fabric."""
    qsfp = {c.netdev for c in choices.values()} | {t for c in choices.values() for t in c.twins} | control_netdevs
    wrong = {node: [l for l in lines if l.split()[0] not in qsfp] for node, lines in carried.items()}
    wrong = {n: ls for n, ls in wrong.items() if ls}
    details = tuple(f"{n}: {l}" for n, ls in carried.items() for l in ls)
    used = sorted({l.split()[0] for ls in carried.values() for l in ls})
    if not any(carried.values()):
        return Verdict(VerdictStatus.FAIL, "no connection between the ranks was seen", "check that the probe ran on every node",
                       details, (), False)
    if wrong:
        node, lines = next(iter(wrong.items()))
        iface = lines[0].split()[0]
        return Verdict(VerdictStatus.FAIL, f"traffic on {iface}, not the QSFP link: {node} {lines[0]}",
                       f"bind every comm variable of {node} to its QSFP interface (re-run `sparkcluster bootstrap`; "
                       f"check GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME in ~/.config/sparkcluster/comm.env)",
                       details, tuple(used), False)
    if set(used) & control_netdevs:
        return Verdict(VerdictStatus.PASS, f"the whole collective ran on the control plane ({', '.join(used)}), which every "
                                           "node reaches (gloo binds one interface); each link of the ring carried its "
                                           "own run", "", details, tuple(used), False)
    return Verdict(VerdictStatus.PASS, f"every connection between the ranks ran over the QSFP interfaces ({', '.join(used)}); "
                           "gloo on CPU checks the binding and path, not RDMA", "", details, tuple(used), False)


def endpoints(facts: Mapping[str, HostFacts]) -> dict[str, Endpoint]:
    """Every address of every node -> its node, netdev and subnet: a failed queue pair's GIDs named as ports."""
    return {str(a.ip): Endpoint(node, i.name, a.network) for node, f in facts.items() for i in f.interfaces
            for a in i.ipv4}


def interface_of(facts: HostFacts, ip: str) -> str | None:
    return next((i.name for i in facts.interfaces if i.has_ip(ip)), None)


def _network_of(facts: HostFacts, ip: str) -> str | None:
    """The interface whose subnet holds `ip` (for a peer's address seen from this node)."""
    address = ipaddress.ip_address(ip)
    return next((i.name for i in facts.interfaces for a in i.ipv4
                 if address.version == a.network.version and address in a.network), None)
