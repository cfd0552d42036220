"""Small-message latency, what a decode step waits on: the probe times all_reduce and all_gather call by call at
decode sizes (8 KiB to 2 MiB), for the whole group and for each link alone. A link's health is its bandwidth and
this together; bench's decode budget reads it from verify's record (`latency_us`) rather than measuring again.

A link is named when it is much slower than its peers at the sizes a decode step's all-reduces carry (32-128 KiB):
more than SLOW_RATIO times their median at each of them (SIM_SLOW_RATIO on the simulator, whose CPU links are noisy).
Real Sparks are also held to the field's figures (thresholds.py, LATENCY_FIELD) for the whole group.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .logs import PROBE_RESULT, Lines, _marked_json, split_lines
from .thresholds import LATENCY_CEILING_RATIO, LATENCY_FIELD, LATENCY_WIRE_FLOOR
from .verdict import Verdict, VerdictStatus

DECODE_WINDOW = (32 << 10, 128 << 10)  # a decode step's all-reduce: hidden size x batch x 2 bytes, tens of KB
SLOW_RATIO = 2.0  # a link this many times slower than its peers' median at every decode size is named
# The simulator's links are gloo on CPUs its nodes share: a healthy link's per-call median swings 3x from one run to
# the next there (364-2,076 us at 32 KiB on an idle pair of a loaded machine), while a twin delayed 2 ms each way
# is 12-34x its peer. Its relative rule therefore asks for this much.
SIM_SLOW_RATIO = 5.0
_SLOW_WORDS = " is slow for small messages"


@dataclass(frozen=True)
class LatencyRow:
    op: str
    size_bytes: int
    median_us: float
    p99_us: float
    calls: int


@dataclass(frozen=True)
class Latency:
    """One group's or one link's per-call times at decode sizes (all_reduce, all_gather)."""

    rows: tuple[LatencyRow, ...]

    def median_us(self, op: str = "all_reduce") -> dict[int, float]:
        return {r.size_bytes: r.median_us for r in self.rows if r.op == op}

    def p99_us(self, op: str = "all_reduce") -> dict[int, float]:
        return {r.size_bytes: r.p99_us for r in self.rows if r.op == op}

    def to_json(self) -> dict[str, Any]:
        """`latency_us`: message bytes -> all_reduce's median microseconds (JSON keys are strings); p99 beside it,
        and all_gather's under its own keys."""
        def keyed(values: Mapping[int, float]) -> dict[str, float]:
            return {str(size): us for size, us in sorted(values.items())}

        return {"latency_us": keyed(self.median_us()), "latency_p99_us": keyed(self.p99_us()),
                "all_gather_latency_us": keyed(self.median_us("all_gather")),
                "all_gather_latency_p99_us": keyed(self.p99_us("all_gather"))}

    def best_of(self, other: Latency) -> Latency:
        """The faster of two readings at each collective and size both hold (median and p99 each)."""
        theirs = {(r.op, r.size_bytes): r for r in other.rows}
        return Latency(tuple(
            replace(r, median_us=min(r.median_us, o.median_us), p99_us=min(r.p99_us, o.p99_us), calls=r.calls + o.calls)
            if (o := theirs.get((r.op, r.size_bytes))) else r for r in self.rows))

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Latency | None:
        """What to_json wrote (verify --json's group or link, the last-verify record); None where it holds none."""
        rows = []
        for op, prefix in (("all_reduce", ""), ("all_gather", "all_gather_")):
            medians, p99s = doc.get(f"{prefix}latency_us"), doc.get(f"{prefix}latency_p99_us") or {}
            if not isinstance(medians, dict) or not isinstance(p99s, dict):
                continue
            for size, median in medians.items():
                try:
                    rows.append(LatencyRow(op, int(size), float(median), float(p99s.get(size) or median), 0))
                except (TypeError, ValueError):
                    return None
        return cls(tuple(rows)) if rows else None


def read_latency(text: Lines) -> Latency | None:
    """The latency rows of the last SPARKCLUSTER_PROBE_RESULT line; None where the probe timed none (an older
    probe, --latency-sizes none) or the line is of another shape."""
    found: Latency | None = None
    for line in split_lines(text):
        if (doc := _marked_json(line, PROBE_RESULT)) is not None:
            found = _rows(doc.get("latency"))
    return found


def _rows(docs: object) -> Latency | None:
    if not isinstance(docs, list) or not docs:
        return None
    try:
        return Latency(tuple(LatencyRow(str(d["op"]), int(d["size_bytes"]), float(d["median_us"]), float(d["p99_us"]),
                                        int(d["iters"])) for d in docs))
    except (KeyError, TypeError, ValueError):
        return None


def at_size(latency_us: Mapping[int, float], size_bytes: int) -> float | None:
    """The median at `size_bytes`, interpolated on log-log axes between the measured sizes (latency grows about
    linearly with size once past the fixed cost); None outside them: an extrapolation would be a guess."""
    if size_bytes in latency_us:
        return latency_us[size_bytes]
    points = sorted(latency_us.items())
    for (s0, t0), (s1, t1) in zip(points, points[1:], strict=False):
        if s0 <= size_bytes <= s1:
            if s0 == s1 or t0 <= 0 or t1 <= 0:
                return t0
            share = math.log(size_bytes / s0) / math.log(s1 / s0)
            return math.exp(math.log(t0) + share * math.log(t1 / t0))
    return None


def size_words(size_bytes: int) -> str:
    """8192 -> "8 KiB", 2097152 -> "2 MiB"."""
    return f"{size_bytes >> 20} MiB" if size_bytes >= 1 << 20 and not size_bytes % (1 << 20) else \
        f"{size_bytes >> 10} KiB" if not size_bytes % 1024 else f"{size_bytes} B"


def summary(latency: Latency, op: str = "all_reduce") -> str:
    """"8 KiB 366/2260 us, 32 KiB 389/607 us, ...": median/p99 per size, as the text shows it beside busbw."""
    p99 = latency.p99_us(op)
    return ", ".join(f"{size_words(size)} {median:.0f}/{p99.get(size, median):.0f} us"
                     for size, median in sorted(latency.median_us(op).items()))


@dataclass(frozen=True)
class Timed:
    """A twin's or a link's latency, with the ends the likely causes point at."""

    label: str
    latency: Latency
    ends: tuple[tuple[str, str], ...]  # (node, netdev) at each end


def slow_link(timed: Sequence[Timed], ratio: float = SLOW_RATIO) -> Verdict | None:
    """WARN naming the link whose all_reduce is more than `ratio` times its peers' median at every decode size
    (DECODE_WINDOW) both measured; the slowest such link when several are. None when every link keeps up, or with
    fewer than two links (nothing to compare with)."""
    found = _slowest(timed, ratio)
    if found is None:
        return None
    worst, times, against = found
    measured = ", ".join(f"{us:.0f} us at {size_words(size)} against {peers:.0f}" for size, us, peers in against)
    ends = ", ".join(f"{node} {netdev}" for node, netdev in worst.ends)
    details = tuple(f"{t.label}: all_reduce {summary(t.latency)} (median/p99)" for t in timed)
    return Verdict(VerdictStatus.WARN,
                   f"{worst.label}{_SLOW_WORDS}: all_reduce {measured} on its peers (median), "
                   f"{times:.1f}x or more: decode's all-reduces wait on it",
                   f"likely causes, at its ends ({ends}): one twin of the port down, so every channel shares the "
                   "other (`ibdev2netdev`: both Up); too few NCCL channels (NCCL_MIN_NCHANNELS, "
                   "NCCL_NCHANNELS_PER_NET_PEER in the comm env); pause frames or congestion marks holding it "
                   "(PFC/ECN: `ethtool -S NETDEV | grep -iE 'pause|ecn|cnp'`, the switch port's PFC); then "
                   "`sparkcluster verify` again", details, (), False)


def _slowest(timed: Sequence[Timed], ratio: float) -> tuple[Timed, float, list[tuple[int, float, float]]] | None:
    """The slowest link over `ratio`, its smallest ratio over the window, and (size, its us, its peers' us)."""
    window = [s for s in _common_sizes(timed) if DECODE_WINDOW[0] <= s <= DECODE_WINDOW[1]]
    if len(timed) < 2 or not window:
        return None
    ratios: dict[str, list[tuple[int, float, float]]] = {}
    for t in timed:
        mine = t.latency.median_us()
        for size in window:
            peers = statistics.median(o.latency.median_us()[size] for o in timed if o is not t)
            ratios.setdefault(t.label, []).append((size, mine[size], peers))
    slow = [(min(us / peers if peers > 0 else math.inf for _, us, peers in ratios[t.label]), t) for t in timed
            if all(us > ratio * peers for _, us, peers in ratios[t.label])]
    if not slow:
        return None
    times, worst = max(slow, key=lambda s: s[0])
    return worst, times, ratios[worst.label]


def slow_link_twice(timed: Sequence[Timed], again: Callable[[str], Latency | None], ratio: float = SLOW_RATIO
                    ) -> tuple[list[Timed], Verdict | None]:
    """slow_link, with the suspect timed once more (`again`, by its label) before it is named, and the faster of
    its two readings kept at each size: a slow link is slow on every run; a run beside a burst of other work (the
    simulated nodes share the machine's cores) is not. Only the suspect pays for the second run."""
    found = _slowest(timed, ratio)
    if found is None:
        return list(timed), None
    suspect = found[0]
    second = again(suspect.label)
    if second is not None:
        timed = [replace(t, latency=t.latency.best_of(second)) if t is suspect else t for t in timed]
    return list(timed), slow_link(timed, ratio)


def _common_sizes(timed: Iterable[Timed]) -> list[int]:
    sizes: set[int] | None = None
    for t in timed:
        mine = set(t.latency.median_us())
        sizes = mine if sizes is None else sizes & mine
    return sorted(sizes or ())


def over_field(latency: Latency) -> Verdict | None:
    """WARN where the whole group's all_reduce takes more than LATENCY_CEILING_RATIO times the field's figure at a
    size the field measured between (real Sparks only: the simulator's CPU gloo has no field to match)."""
    field = dict(LATENCY_FIELD)
    for size, us in sorted(latency.median_us().items()):
        expected = at_size(field, size)
        if expected is not None and us > LATENCY_CEILING_RATIO * expected:
            wire_size, wire_us = LATENCY_WIRE_FLOOR
            return Verdict(VerdictStatus.WARN,
                           f"all_reduce takes {us:.0f} us at {size_words(size)}, more than {LATENCY_CEILING_RATIO:g}x "
                           f"the {expected:.0f} us owners measured on a direct pair (the wire's floor: {wire_us:g} us "
                           f"for {size_words(wire_size)})",
                           "decode waits on every all-reduce: check that both twins carry (`verify` names a slow "
                           "link), the channel count (NCCL_MIN_NCHANNELS), PFC/ECN on the ports; `nccl-report` on "
                           "the log shows the transport", (f"all_reduce {summary(latency)} (median/p99)",), (), False)
    return None


def with_latency(verdict: Verdict, found: Verdict | None) -> Verdict:
    """A latency finding in the verdict: its cause where bandwidth and transport passed; otherwise a detail, or
    the cause's addition where both name the same link."""
    if found is None:
        return verdict
    if verdict.status is VerdictStatus.PASS:
        return replace(found, details=(*found.details, *verdict.details))
    label, slow_words, _ = found.cause.partition(_SLOW_WORDS)
    if slow_words and verdict.cause.startswith(label):
        slow = found.cause.removeprefix(label)
        return replace(verdict, cause=f"{verdict.cause}; it{slow}", fix=f"{verdict.fix}; if it stays slow for small "
                       f"messages, {found.fix}", details=(*verdict.details, *found.details))
    return replace(verdict, details=(*verdict.details, f"latency: {found.status} {found.cause}", *found.details))
