"""`bench --explain A B`: why two results differ. Two sides' facts (explain/facts.py) are lined up field by field,
every difference named, and ranked by how much of a number its cause can move: speculative acceptance first (it
scales decode directly), then the engine's flags by effect, the model and layout, versions and images, each node's
kernel, driver and firmware, the load's concurrency and prompt shape, the memory ceiling. A field one side does not
know is said to be unknown, never taken as equal; a published row lists what it never recorded."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...engine.nodetext import printable
from .facts import CAUSES, LAYOUT_GROUP, NOT_SET, Cause, Fact
from .flags import EFFECT_NAMES, Effect
from .sides import NEVER_RECORDED, Side


@dataclass(frozen=True)
class Difference:
    key: str
    cause: Cause
    a: str | float | None
    b: str | float | None
    why: str
    rank: int = 0
    share: bool = False  # a fraction, shown as a percentage
    group: str = ""  # the receipt field it comes from

    @property
    def kind(self) -> str:
        """The cause as shown; a flag's (or an NCCL setting's, or a measured engine figure's) names its effect."""
        if self.cause is Cause.FLAGS and self.rank:
            what = "flag" if self.key.startswith("-") else "NCCL setting" if self.group == "comm_env" else \
                "engine, measured"
            return f"{what}: {EFFECT_NAMES[Effect(self.rank)]}"
        return CAUSES[self.cause]

    def to_json(self) -> dict[str, Any]:
        return {"field": self.key, "cause": self.cause.name.lower(), "kind": self.kind, "a": self.a, "b": self.b,
                "why": self.why}


@dataclass(frozen=True)
class Figure:
    row: str
    figure: str
    a: float
    b: float

    @property
    def ratio(self) -> float | None:
        return self.b / self.a if self.a else None


@dataclass(frozen=True)
class Explanation:
    a: Side
    b: Side
    figures: tuple[Figure, ...]
    differences: tuple[Difference, ...]  # ranked
    unknown: tuple[str, ...]  # fields one side cannot know: they may explain part of the gap
    never_recorded: tuple[str, ...] = ()  # a published row's: what it never said it ran
    same: tuple[str, ...] = field(default=())  # fields both know and agree on

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a.name, "b": self.b.name,
                "numbers": [{"row": f.row, "figure": f.figure, "a": f.a, "b": f.b, "ratio": f.ratio}
                            for f in self.figures],
                "differences": [d.to_json() for d in self.differences], "unknown": list(self.unknown),
                "never_recorded": list(self.never_recorded), "same": list(self.same)}


def _differ(a: str | float, b: str | float) -> bool:
    """Figures within 5% of each other (or 0.02 apart, for rates) are the same; text must match exactly."""
    if isinstance(a, float) and isinstance(b, float):
        return not math.isclose(a, b, rel_tol=0.05, abs_tol=0.02)
    return str(a) != str(b)


def _aligned(a: Side, b: Side) -> tuple[dict[str, Fact], dict[str, Fact]]:
    """Node facts keyed by name where both clusters name their nodes alike, else by position ("node 2 kernel")."""
    def names(side: Side) -> list[str]:
        found = {f.node: f.key.removesuffix(" " + f.label) for f in side.facts.values() if f.node is not None}
        return [found[i] for i in sorted(found)]

    if names(a) == names(b) or not names(a) or not names(b):
        return dict(a.facts), dict(b.facts)

    def rekey(side: Side) -> dict[str, Fact]:
        out = {}
        for f in side.facts.values():
            key = f.key if f.node is None else f"node {f.node + 1} {f.label}"
            out[key] = dataclasses.replace(f, key=key)
        return out
    return rekey(a), rekey(b)


def _why(fact: Fact, a: str | float | None, b: str | float | None) -> str:
    if fact.key == "mean acceptance length" and isinstance(a, float) and isinstance(b, float) and a:
        return f"{fact.why}: from this alone B's decode is about {b / a * 100:.0f}% of A's"
    return fact.why


def _shown(value: str | float | None) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 1 else f"{value:.3g}"
    return value


def _knows(side: Side, group: str) -> bool:
    return not any(group == g or group.startswith(g + ".") for g in side.unknown_groups)


def _who(a_unknown: bool, b_unknown: bool) -> str:
    return "A and B" if a_unknown and b_unknown else "A" if a_unknown else "B"


def _short(value: str | float | None, share: bool = False, width: int = 60) -> str:
    """A long value (a --compilation-config) cut for the text; --json keeps it whole."""
    text = f"{value * 100:.0f}%" if share and isinstance(value, float) else _shown(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def explain(a: Side, b: Side) -> Explanation:
    """Between two layouts of `bench --layouts` results the layout is what was varied: its facts rank first."""
    facts_a, facts_b = _aligned(a, b)
    layouts = a.layout is not None and b.layout is not None
    differences, same = [], []
    theirs = frozenset() if b.published else b.unknown_groups  # a published row's: listed as never recorded
    unknown = [f"{group}: unknown to {_who(group in a.unknown_groups, group in theirs)}"
               for group in sorted(a.unknown_groups | theirs)]
    for key in dict.fromkeys([*facts_a, *facts_b]):
        fa, fb = facts_a.get(key), facts_b.get(key)
        fact = fa or fb
        assert fact is not None
        if not (_knows(a, fact.group) and _knows(b, fact.group)):
            continue  # the whole field is unknown to a side: said once above
        if fact.group == LAYOUT_GROUP and not layouts:
            continue  # a layout's own facts line up only against another layout's
        # A field only one side has: a flag or a variable not set there, a position it did not draft.
        absent = NOT_SET if fact.key.startswith("-") or fact.group == "comm_env" else "none"
        va = absent if fa is None else fa.value
        vb = absent if fb is None else fb.value
        if va is None or vb is None:
            unknown.append(f"{key}: unknown to {_who(va is None, vb is None)}")
        elif _differ(va, vb):
            differences.append(Difference(key, fact.cause, va, vb, _why(fact, va, vb), fact.rank, fact.share,
                                          fact.group))
        else:
            same.append(key)
    differences.sort(key=lambda d: (not (layouts and d.cause is Cause.LAYOUT), d.cause, d.rank))
    never = tuple(text for group, text in NEVER_RECORDED.items() if group in b.unknown_groups) if b.published else ()
    return Explanation(a, b, tuple(_figures(a, b)), tuple(differences), tuple(unknown), never, tuple(same))


def _figures(a: Side, b: Side) -> Iterable[Figure]:
    for row, figures in a.numbers.items():
        theirs = b.numbers.get(row, {})
        for name, value in figures.items():
            if name in theirs:
                yield Figure(row, name, value, theirs[name])



def render(found: Explanation) -> str:
    """Plain lines: the numbers side by side, then each difference ranked, then what cannot be compared."""
    lines = [f"A: {found.a.name}", f"B: {found.b.name}", ""]
    if found.figures:
        lines.append("numbers, A -> B:")
        width = max(len(f"{f.row}  {f.figure}") for f in found.figures)
        for f in found.figures:
            ratio = "" if f.ratio is None else f"  ({f.ratio * 100:.0f}%)"
            lines.append(f"  {f'{f.row}  {f.figure}':<{width}}  {_shown(f.a)} -> {_shown(f.b)}{ratio}")
    else:
        lines.append("numbers: no row of the same shape on both sides (concurrency, or pp/tg/depth)")
    lines.append("")
    if found.differences:
        lines.append("differences, ranked by what each can explain:")
        for number, d in enumerate(found.differences, start=1):
            lines.append(f"  {number}. {d.key}: A {_short(d.a, d.share)}, B {_short(d.b, d.share)}  [{d.kind}]"
                         + (f" {d.why}" if d.why else ""))
    else:
        lines.append("differences: none in what both record")
    if found.unknown:
        lines += ["", "unknown, so not ruled out:", *(f"  {u}" for u in found.unknown)]
    if found.never_recorded:
        lines += ["", "the published row never recorded:", *(f"  {n}" for n in found.never_recorded)]
    lines += ["", f"the same on both sides: {len(found.same)} field{'s' if len(found.same) != 1 else ''}"]
    # Every value here comes from someone's file: an escape in one would retitle or clear the reader's terminal.
    return "\n".join(printable(line) for line in lines)
