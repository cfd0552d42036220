"""How a served model occupies the nodes, as one value: N replicas (independent engines behind a router), each
tensor parallel x pipeline parallel across its own nodes, one GPU per Spark. A single engine is the layout with
one replica. Placement follows the fabric graph: the nodes in cable order from the head (a ring's walk,
node/network.cable_order), each replica taking the next nodes/N of it, so that a replica's ranks are cabled to
each other and the head (where the router runs) is replica 0's rank 0.

Field numbers (issue 40): on two Sparks TP 2 ran 2.09x one node per stream, PP 2 1.08x, two replicas behind a
router 1.30-1.91x aggregate at 8-32 users; which wins depends on the concurrency, so `bench --layouts` measures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

# The layouts `bench --layouts` names: every node in one TP group, in one pipeline, or one replica per node.
LayoutKind = Literal["tp", "pp", "replicas"]
LAYOUT_KINDS: tuple[LayoutKind, ...] = get_args(LayoutKind)


@dataclass(frozen=True)
class Placement:
    """One replica on its nodes: `nodes` in rank order (rank 0, which answers HTTP, first) and the port its API
    server listens on."""

    index: int
    nodes: tuple[str, ...]
    port: int

    @property
    def head(self) -> str:
        return self.nodes[0]


@dataclass(frozen=True)
class LayoutAsk:
    """What the flags, the recipe and the inventory ask of a layout before the nodes are known: any part unset.
    Sizing it on the selected nodes (serving/parallel.size_layout) gives the Layout."""

    replicas: int | None = None
    tp: int | None = None
    pp: int | None = None


@dataclass(frozen=True)
class Layout:
    replicas: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        if min(self.replicas, self.tp, self.pp) < 1:
            raise ValueError(f"a layout needs at least 1 replica, TP 1 and PP 1, not {self}")

    @property
    def nodes_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def nodes(self) -> int:
        return self.replicas * self.nodes_per_replica

    @property
    def routed(self) -> bool:
        """Several engines answer one endpoint: a router sits in front of them."""
        return self.replicas > 1

    @property
    def name(self) -> str:
        """Short and stable, for tables and --json: `tp2`, `tp1pp2`, `2x tp1`."""
        inner = f"tp{self.tp}" + (f"pp{self.pp}" if self.pp > 1 else "")
        return f"{self.replicas}x {inner}" if self.replicas > 1 else inner

    def describe(self) -> str:
        inner = f"TP {self.tp} x PP {self.pp}"
        return f"{self.replicas} replicas of {inner} behind a router" if self.routed else inner

    def place(self, order: Sequence[str], port: int) -> tuple[Placement, ...]:
        """The replicas on `order` (the nodes in cable order, the head first): replica i takes the next
        nodes/replicas of it. One replica answers at `port` itself; several answer at port+1, port+2... and the
        router at `port`."""
        if len(order) != self.nodes:
            raise ValueError(f"{self.describe()} takes {self.nodes} nodes, not {len(order)}")
        k = self.nodes_per_replica
        if not self.routed:
            return (Placement(0, tuple(order), port),)
        return tuple(Placement(i, tuple(order[i * k:(i + 1) * k]), port + 1 + i) for i in range(self.replicas))

    def behind_router(self, order: Sequence[str], port: int) -> tuple[Placement, ...]:
        """The replicas a router answers for (place's), what the serve record keeps; none for one engine, which
        answers at `port` itself."""
        return self.place(order, port) if self.routed else ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "replicas": self.replicas, "tp": self.tp, "pp": self.pp}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Layout:
        return cls(int(doc.get("replicas", 1)), int(doc.get("tp", 1)), int(doc.get("pp", 1)))

    def asked(self) -> LayoutAsk:
        """This layout as an ask: every part said (`bench --layouts` asks serve for each layout it measures)."""
        return LayoutAsk(self.replicas, self.tp, self.pp)

    @classmethod
    def of_kind(cls, kind: LayoutKind, nodes: int) -> Layout:
        """The layout `bench --layouts` means by a kind on `nodes` nodes."""
        if kind == "tp":
            return cls(1, nodes, 1)
        if kind == "pp":
            return cls(1, 1, nodes)
        return cls(nodes, 1, 1)
