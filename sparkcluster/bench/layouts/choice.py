"""Which layouts `bench --layouts` serves on the selected nodes: each kind named (tp, pp, replicas) as the layout
it means there (serving/layout.py), refused before anything connects where it does not fit the nodes or the
recipe, with the fix (exit 2)."""

from __future__ import annotations

from ...engine.errors import UsageError
from ...engine.inventory import Inventory
from ...recipes.types import Recipe
from ...serving.layout import LAYOUT_KINDS, Layout, LayoutKind
from ...serving.parallel import check_layout

EXAMPLE = "e.g. --layouts tp,replicas"


def parse_kinds(values: list[str]) -> tuple[LayoutKind, ...]:
    """`--layouts tp,pp replicas`: each kind once, in the order given."""
    words = [w.strip() for text in values for w in text.split(",") if w.strip()]
    unknown = [w for w in words if w not in LAYOUT_KINDS]
    if unknown or not words:
        raise UsageError(f"--layouts {' '.join(values)}: {', '.join(map(repr, unknown)) or 'no layout'} is not one "
                         f"of {', '.join(LAYOUT_KINDS)}", EXAMPLE)
    return tuple(dict.fromkeys(k for w in words for k in LAYOUT_KINDS if k == w))


def layouts_for(kinds: tuple[LayoutKind, ...], inventory: Inventory, recipe: Recipe) -> tuple[Layout, ...]:
    """The layout each kind means on the selected nodes, each checked as `serve` checks it."""
    count = len(inventory.hosts)
    if count == 1 and kinds != ("tp",):
        others = ", ".join(k for k in kinds if k != "tp")
        raise UsageError(f"--layouts {','.join(kinds)} on 1 node: {others} needs 2 nodes or more (on one node every "
                         "layout is the same single engine)", "select 2 or more nodes (inventory or --limit)")
    return tuple(_checked(kind, Layout.of_kind(kind, count), inventory, recipe) for kind in kinds)


def _checked(kind: LayoutKind, layout: Layout, inventory: Inventory, recipe: Recipe) -> Layout:
    try:
        return check_layout(layout.replicas, layout.tp, layout.pp, inventory, recipe)
    except UsageError as e:
        raise UsageError(f"--layouts {kind} ({layout.describe()}): {e.message}",
                         f"{e.fix}; or measure the other layouts (leave {kind} out of --layouts)") from None
