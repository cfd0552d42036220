"""The Prometheus text format (0.0.4), written: metric families of samples, each family's HELP and TYPE once.

Label values are escaped as the format says (backslash, double quote, newline), so nothing a node reports can
open a label or a line of its own. Values are finite floats or the format's NaN; a figure sparkcluster does not
know is left out rather than written as 0 (an alert reads an absent series as unknown, a 0 as a reading).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

MetricType = Literal["gauge", "counter", "untyped"]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Family:
    """One metric: its name (a counter's with `_total`), help and type, and its samples by label set."""

    name: str
    help: str
    type: MetricType = "gauge"
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float | None, **labels: str) -> None:
        """A sample; None (unknown) adds nothing."""
        if value is not None:
            self.samples.append((labels, float(value)))


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items())) + "}"


def render(families: Iterable[Family]) -> str:
    """The text a scrape returns; a family without samples is left out (its HELP alone says nothing)."""
    lines: list[str] = []
    for family in families:
        if not family.samples:
            continue
        lines.append(f"# HELP {family.name} {family.help.replace(chr(10), ' ')}")
        lines.append(f"# TYPE {family.name} {family.type}")
        lines.extend(f"{family.name}{_labels(labels)} {_number(value)}" for labels, value in family.samples)
    return "\n".join(lines) + "\n" if lines else ""
