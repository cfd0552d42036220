"""The statistics every method's arithmetic draws on, pure: a percentile and its distribution, a mean with its
population std, the length of a union of intervals and the most tokens in any window of time. The methods
differ in what they feed them (methods/*/arithmetic.py), not in how a percentile or a peak is taken."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PEAK_WINDOW_S = 1.0


@dataclass(frozen=True)
class Distribution:
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True)
class Metric:
    """A mean and population std with the values they came from (llama-benchy's shape of a figure)."""
    mean: float
    std: float
    values: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "values": list(self.values)}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Sequence[float]) -> Distribution:
    if not values:
        return Distribution(None, None, None, None)
    return Distribution(sum(values) / len(values), percentile(values, 50), percentile(values, 90),
                        percentile(values, 99))


def metric(values: Sequence[float], multiplier: float = 1.0) -> Metric | None:
    if not values:
        return None
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))  # numpy's default: population
    return Metric(mean * multiplier, std * multiplier, tuple(v * multiplier for v in values))


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals, overlaps counted once."""
    total, reach = 0.0, float("-inf")
    for begin, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(begin, reach)
        reach = end
    return total


def peak_rate(events: Sequence[tuple[float, float]], window_s: float = PEAK_WINDOW_S) -> float:
    """The most tokens in any half-open window [t, t + window_s), t at an event (a window that starts between
    events holds no more than one that starts at the next event), divided by window_s. Events are (time,
    tokens). The same count as llama-benchy's windows (end - window_s, end] ending at a token: a window holding
    tokens i..j either way also holds them the other way."""
    ordered = sorted(events)
    best, total, tail = 0.0, 0.0, len(ordered)
    # Walk windows from the right so each token enters and leaves the running sum once.
    for head in range(len(ordered) - 1, -1, -1):
        start = ordered[head][0]
        total += ordered[head][1]
        while ordered[tail - 1][0] >= start + window_s:
            tail -= 1
            total -= ordered[tail][1]
        best = max(best, total)
    return best / window_s
