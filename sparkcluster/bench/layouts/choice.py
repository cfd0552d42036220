"""Which layouts `bench --layouts` serves on the selected nodes: each kind named (tp, pp, replicas) as the layout
it means there (serving/layout.py). Each is then checked as `serve` checks it (bench/layouts/cli.py), and a refusal
names the layout and how to leave it out, before anything connects (exit 2)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ...engine.errors import UsageError
from ...serving.layout import LAYOUT_KINDS, Layout, LayoutKind

EXAMPLE = "e.g. --layouts tp,replicas"


def parse_kinds(values: list[str]) -> tuple[LayoutKind, ...]:
    """`--layouts tp,pp replicas`: each kind once, in the order given."""
    words = [w.strip() for text in values for w in text.split(",") if w.strip()]
    unknown = [w for w in words if w not in LAYOUT_KINDS]
    if unknown or not words:
        raise UsageError(f"--layouts {' '.join(values)}: {', '.join(map(repr, unknown)) or 'no layout'} is not one "
                         f"of {', '.join(LAYOUT_KINDS)}", EXAMPLE)
    return tuple(dict.fromkeys(k for w in words for k in LAYOUT_KINDS if k == w))


def layouts_for(kinds: tuple[LayoutKind, ...], count: int) -> tuple[Layout, ...]:
    """The layout each kind means on `count` nodes; on one node every kind is the same single engine."""
    if count == 1 and kinds != ("tp",):
        others = ", ".join(k for k in kinds if k != "tp")
        raise UsageError(f"--layouts {','.join(kinds)} on 1 node: {others} needs 2 nodes or more (on one node every "
                         "layout is the same single engine)", "select 2 or more nodes (inventory or --limit)")
    return tuple(Layout.of_kind(kind, count) for kind in kinds)


@contextmanager
def refused_as(kind: LayoutKind, layout: Layout) -> Iterator[None]:
    """A refusal of serve's, for one layout of several: named by its kind, with how to measure the others."""
    try:
        yield
    except UsageError as e:
        raise UsageError(f"--layouts {kind} ({layout.describe()}): {e.message}",
                         f"{e.fix}; or measure the other layouts (leave {kind} out of --layouts)") from None
