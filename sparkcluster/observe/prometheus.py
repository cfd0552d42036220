"""A reader of the Prometheus text format (what vLLM's /metrics serves), for `top` and `bench`.

It never raises on what a server sends: a line it cannot read is skipped and counted, NaN and ±Inf are kept
as floats but left out of sums and deltas, and what one scrape may hold is capped. Hand-written rather than
prometheus_client's parser (not a dependency): that one raises ValueError at the first malformed line, losing
the whole scrape where one odd line would otherwise blank every figure, and it took 1.8-1.9x the CPU time on a
real 619-line vLLM scrape (~9 ms vs ~5 ms; benchmarks/metrics_parse.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

MAX_TEXT_CHARS = 8 << 20  # a vLLM scrape is ~10-60 KB; anything past this is not read
MAX_SAMPLES = 200_000
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float  # may be NaN or ±Inf, as the text said


@dataclass(frozen=True)
class Scrape:
    """One /metrics text, read: its samples in order, and how many lines could not be read."""

    samples: tuple[Sample, ...] = ()
    skipped: int = 0
    truncated: bool = False

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def total(self, name: str) -> float | None:
        """The metric summed over its label sets (one per engine or model), finite values only; None if absent."""
        values = [s.value for s in self.samples if s.name == name and math.isfinite(s.value)]
        if not values:
            return None
        try:
            return math.fsum(values)
        except OverflowError:  # finite values whose sum is beyond a float's range (a corrupt endpoint): no figure
            return None

    def first(self, *names: str) -> float | None:
        """The total of the first of `names` present (a metric renamed between vLLM versions)."""
        for name in names:
            value = self.total(name)
            if value is not None:
                return value
        return None

    def totals(self) -> dict[str, float]:
        """Every metric's finite total."""
        out: dict[str, float] = {}
        for s in self.samples:
            if math.isfinite(s.value):
                out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    def histogram(self, name: str) -> Histogram | None:
        """`name`'s buckets summed over label sets by upper bound, with its _count and _sum; None if absent."""
        buckets: dict[float, float] = {}
        for s in self.samples:
            if s.name != f"{name}_bucket" or not math.isfinite(s.value):
                continue
            le = dict(s.labels).get("le")
            bound = _number(le) if le is not None else None
            if bound is None or math.isnan(bound):
                continue
            buckets[bound] = buckets.get(bound, 0.0) + s.value
        if not buckets:
            return None
        ordered = tuple(sorted(buckets.items()))
        count = self.total(f"{name}_count")
        return Histogram(ordered, ordered[-1][1] if count is None else count, self.total(f"{name}_sum") or 0.0)


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending; may end at +Inf
    count: float
    sum: float = 0.0

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since `earlier` (the same bucket bounds); itself after a counter reset."""
        if earlier is None:
            return self
        before = dict(earlier.buckets)
        delta = tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets)
        if any(c < 0 for _, c in delta) or self.count < earlier.count:
            return self  # the server restarted: its counters began again
        return Histogram(delta, self.count - earlier.count, self.sum - earlier.sum)

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket that holds the q-th observation; the
        highest finite bound when it falls in +Inf; None without observations."""
        if not self.buckets or not 0 <= q <= 1:
            return None
        total = self.buckets[-1][1]
        if not math.isfinite(total) or total <= 0:
            return None
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in self.buckets:
            if count >= rank:
                if math.isinf(bound):
                    return lower_bound
                if count == lower_count:
                    return bound
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
            lower_bound, lower_count = bound, max(count, lower_count)
        return lower_bound


def parse(text: str) -> Scrape:
    """Reads Prometheus text exposition (version 0.0.4). Never raises for any str."""
    truncated = len(text) > MAX_TEXT_CHARS
    samples: list[Sample] = []
    skipped = 0
    for line in text[:MAX_TEXT_CHARS].splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if len(samples) >= MAX_SAMPLES:
            truncated = True
            break
        sample = _sample(line)
        if sample is None:
            skipped += 1
        else:
            samples.append(sample)
    return Scrape(tuple(samples), skipped, truncated)


def _sample(line: str) -> Sample | None:
    """`name{label="value",...} value [timestamp]`, or None where the line is not that."""
    i, n = 0, len(line)
    while i < n and (line[i].isalnum() or line[i] in "_:"):
        i += 1
    name = line[:i]
    if not name or name[0].isdigit() or not name.isascii():
        return None
    labels: list[tuple[str, str]] = []
    if i < n and line[i] == "{":
        read = _labels(line, i + 1)
        if read is None:
            return None
        labels, i = read
    rest = line[i:].split()
    if not rest or len(rest) > 2 or (i < n and not line[i].isspace()):
        return None
    value = _number(rest[0])
    if value is None:
        return None
    return Sample(name, tuple(labels), value)


def _labels(line: str, i: int) -> tuple[list[tuple[str, str]], int] | None:
    """The label pairs from just after `{` to the closing `}`; (pairs, index after `}`)."""
    pairs: list[tuple[str, str]] = []
    n = len(line)
    while True:
        while i < n and line[i] in " ,":
            i += 1
        if i < n and line[i] == "}":
            return pairs, i + 1
        start = i
        while i < n and (line[i].isalnum() or line[i] == "_"):
            i += 1
        key = line[start:i]
        if not key or i + 1 >= n or line[i] != "=" or line[i + 1] != '"':
            return None
        i += 2
        value: list[str] = []
        while i < n and line[i] != '"':
            if line[i] == "\\" and i + 1 < n:
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(line[i + 1], "\\" + line[i + 1]))
                i += 2
            else:
                value.append(line[i])
                i += 1
        if i >= n:
            return None
        pairs.append((key, "".join(value)))
        i += 1


def _number(word: str) -> float | None:
    """A sample value as Prometheus writes it (Go's ParseFloat: NaN, +Inf, -Inf, exponents), or None."""
    try:
        return float(word)
    except ValueError:
        return None


def rate(now: Scrape, before: Scrape | None, names: Iterable[str], seconds: float) -> float | None:
    """Per-second increase of a counter between two scrapes (the first of `names` present in both); None
    without a previous scrape, an interval, or after a counter reset."""
    if before is None or not seconds > 0:
        return None
    for name in names:
        a, b = before.total(name), now.total(name)
        if a is not None and b is not None:
            return (b - a) / seconds if b >= a else None
    return None
