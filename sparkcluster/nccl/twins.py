"""Link health, twin by twin: each QSFP port is two PCIe x4 "twins", and a run over both together hides one that
is degraded (a re-plugged ConnectX-7 on a power-limited slot, a FEC mismatch) or that carries nothing. verify
therefore also runs the probe over each twin alone (NCCL pinned to that twin's HCA; gloo bound to its netdev and
rendezvous on the head's address on it) and compares them: twins of one port should deliver about the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol, TypeVar

from ..engine.errors import SparkclusterError
from ..engine.facts import HostFacts
from ..node.network import QsfpChoice
from .logs import BandwidthRow
from .proberun import ProbeTimedOut
from .verdict import Verdict, VerdictStatus

MAX_RATIO = 2.0  # twins of one port differing by more than this: one of them is degraded
GLOO_TWIN_SIZES = "4M,16M"
NCCL_TWIN_SIZES = "64M,256M"


@dataclass(frozen=True)
class Twin:
    """Twin `index` of the cabled port on every node: its netdev, HCA and address there."""

    index: int
    netdevs: dict[str, str]
    hcas: dict[str, str]
    ips: dict[str, str]

    @property
    def label(self) -> str:
        names = sorted(set(self.netdevs.values()))
        return f"twin {self.index} ({', '.join(names)})"


@dataclass(frozen=True)
class TwinMeasure:
    twin: Twin
    busbw_gbps: float | None  # at the largest size; None when the run over it failed
    error: str = ""
    timed_out: bool = False  # the run did not finish in its time: a slow twin, not a dead one


def twins_of(choices: Mapping[str, QsfpChoice], facts: Mapping[str, HostFacts]) -> list[Twin]:
    """The twins every node has, paired by position (the eugr-preferred enpXs0fN twin first), with their address."""
    per_node: dict[str, list[tuple[str, str, str]]] = {}
    for node, choice in choices.items():
        pairs = sorted(zip(choice.twins, choice.hcas, strict=False), key=lambda p: (p[0].startswith("enP"), p[0]))
        listed = []
        for netdev, hca in pairs:
            interface = facts[node].interface(netdev)
            if interface is None or not interface.ipv4:
                break
            listed.append((netdev, hca, str(interface.ipv4[0].ip)))
        per_node[node] = listed
    count = min((len(v) for v in per_node.values()), default=0)
    return [Twin(i, {n: v[i][0] for n, v in per_node.items()}, {n: v[i][1] for n, v in per_node.items()},
                 {n: v[i][2] for n, v in per_node.items()}) for i in range(count)]


def twin_env(twin: Twin, backend: str) -> dict[str, dict[str, str]]:
    """Per node, what pins the probe to this twin alone."""
    if backend == "nccl":
        return {n: {"NCCL_IB_HCA": hca} for n, hca in twin.hcas.items()}
    return {n: {"GLOO_SOCKET_IFNAME": netdev, "TP_SOCKET_IFNAME": netdev} for n, netdev in twin.netdevs.items()}


def best_at_largest(rows: Sequence[BandwidthRow]) -> float | None:
    if not rows:
        return None
    largest = max(r.size_bytes for r in rows)
    return max(r.best_busbw_gbps for r in rows if r.size_bytes == largest)


def measure(twins: Sequence[Twin], run: Callable[[Twin], Sequence[BandwidthRow]]) -> list[TwinMeasure]:
    out = []
    for twin in twins:
        try:
            out.append(TwinMeasure(twin, best_at_largest(run(twin))))
        except ProbeTimedOut as e:
            out.append(TwinMeasure(twin, None, e.message.splitlines()[0], timed_out=True))
        except SparkclusterError as e:
            out.append(TwinMeasure(twin, None, e.message.splitlines()[0]))
    return out


class Measured(Protocol):
    """A twin's or a link's measure: a dataclass with its busbw."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def busbw_gbps(self) -> float | None: ...


M = TypeVar("M", bound=Measured)


def judged_twice(measures: Sequence[M], judge: Callable[[Sequence[M]], Verdict | None],
                 again: Callable[[M], Sequence[BandwidthRow]]) -> tuple[list[M], Verdict | None]:
    """The judgement, with a slow reading measured once more before it is blamed, and the better of its two kept.
    A degraded twin or link is slow on every run; one run that lands beside a burst of other work (the simulated
    nodes share the machine's cores) is not. Only the suspect pays for the second run; one that carried nothing
    is blamed at once."""
    verdict = judge(measures)
    if verdict is None or any(not m.busbw_gbps for m in measures):
        return list(measures), verdict
    slow = min(measures, key=lambda m: m.busbw_gbps or 0.0)
    try:
        second = best_at_largest(again(slow))
    except SparkclusterError:
        return list(measures), verdict
    if second is None or second <= (slow.busbw_gbps or 0.0):
        return list(measures), verdict
    measures = [replace(m, busbw_gbps=second) if m is slow else m for m in measures]
    return measures, judge(measures)


def judge_twins(measures: Sequence[TwinMeasure], head: str) -> Verdict | None:
    """FAIL naming a twin that carries nothing, or the slower of two twins more than MAX_RATIO apart."""
    details = tuple(f"{m.twin.label}: " + (f"busbw {m.busbw_gbps:.3f} GB/s alone" if m.busbw_gbps is not None
                                           else f"carried nothing ({m.error})") for m in measures)
    dead = [m for m in measures if not m.busbw_gbps]
    if dead:
        m = dead[0]
        if m.timed_out:
            netdev = m.twin.netdevs[head]
            peer = next(ip for node, ip in m.twin.ips.items() if node != head)
            return Verdict(VerdictStatus.FAIL, f"{m.twin.label} is too slow to finish the probe: {m.error}",
                           f"time it: `ping -c 5 -I {netdev} {peer}` on {head} (a healthy twin answers in well under "
                           f"a millisecond); a slow one: `ethtool -S {netdev}` on both ends (pause frames, discards), "
                           "the cable, the switch port", details, (), False)
        return Verdict(VerdictStatus.FAIL, f"{m.twin.label} carries nothing on its own"
                                           f"{f': {m.error}' if m.error else ''}",
                       f"check that twin on every node: `ip addr show {m.twin.netdevs[head]}` (its own /24, up), "
                       "`ibdev2netdev` (Up), the cable seated; then `sparkcluster bootstrap`", details, (), False)
    if len(measures) < 2:
        return None
    slow, fast = sorted(measures, key=lambda m: m.busbw_gbps or 0.0)[0], max(measures, key=lambda m: m.busbw_gbps or 0.0)
    assert slow.busbw_gbps is not None and fast.busbw_gbps is not None
    if fast.busbw_gbps <= MAX_RATIO * slow.busbw_gbps:
        return None
    return Verdict(VerdictStatus.FAIL, f"{slow.twin.label} is degraded: {slow.busbw_gbps:.3f} GB/s alone against "
                                       f"{fast.busbw_gbps:.3f} on {fast.twin.label} (more than {MAX_RATIO:g}x apart)",
                   f"on each node: `sudo dmesg | grep -i mlx5` (insufficient power, PCIe link degraded: reboot), "
                   f"`ethtool {slow.twin.netdevs[head]}` (speed 200000Mb/s) and `ethtool --show-fec` on both ends "
                   "(the same FEC), the MTU of both twins; reseat the cable", details, (), False)
