"""fabric.cabling: on the head, before anything changes, the fabric as the cables make it (discovery on every
node) against what the inventory says; a mistake fails the run with the re-cabling that fixes it."""

from __future__ import annotations

from ...engine.steps.base import HostContext, NoArgs, Plan, Step, StepFailed, register
from ..discovery import check_cabling, fabric_of
from ..fabric import Kind


@register
class FabricCabling(Step):
    name = "fabric.cabling"
    Args = NoArgs

    def check(self, ctx: HostContext) -> Plan:
        # Every node runs this (so each one's facts are gathered, and each one stops here when the cabling is
        # wrong); the first to ask probes them all, once, and all read the same graph.
        fabric = fabric_of(ctx.session)
        checked = check_cabling(ctx.inventory, fabric, ctx.all_facts)
        head = ctx.inventory.head.name
        if checked.problems:
            if ctx.host.name != head:
                raise StepFailed(f"the fabric is miscabled (the head {head} says how); nothing was changed",
                                 "re-cable as the head's message says, then run bootstrap again")
            raise StepFailed("; ".join(p.what for p in checked.problems) + "; nothing was changed",
                             "; ".join(p.fix for p in checked.problems))
        if ctx.host.name != head:
            return Plan(f"checked from the head {head}", skip=True)
        shape = fabric.kind.value
        if fabric.kind is Kind.RING:
            order = fabric.ring_order()
            shape += ": " + " -> ".join((*order, order[0]))
        warnings = tuple(f"{e.label()} is Up but nobody answered on it" for e in fabric.silent)
        warnings += tuple(f"{n} saw no neighbour and none saw it: its cables are left to the preflight"
                          for n in fabric.silent_nodes)
        count = f"{len(fabric.cables())} cables" if fabric.cables() else f"{len(fabric.links)} links"
        return Plan(f"{shape}, {count} (inventory: {checked.expected})", warnings=warnings)
