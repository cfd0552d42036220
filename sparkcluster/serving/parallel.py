"""How many nodes a serve takes: replicas x tensor parallel x pipeline parallel = the nodes selected, one GPU per
Spark (serving/layout.py). A recipe's replicas, TP and PP are the defaults when --replicas, --tp and --pp are not
given; its node bounds (eugr's cluster_only/solo_only, sparkrun's min_nodes/max_nodes) are checked here, before
anything connects."""

from __future__ import annotations

from ..engine.errors import UsageError
from ..engine.inventory import Inventory
from ..recipes.types import Recipe
from .launch import Launcher, RuntimeName
from .layout import Layout, LayoutAsk


def size_layout(ask: LayoutAsk, inventory: Inventory, recipe: Recipe) -> Layout:
    """The layout for the selected nodes, the one way serve and `bench --layouts` size it: the replicas asked (else
    1) dividing the nodes, PP asked (else 1), and TP asked (else a replica's share of the nodes / PP); refused with
    the fix, before anything connects, when it cannot serve this recipe. A recipe's node bounds are an engine's: one
    engine takes every node selected, and each replica is one (solo_only serves one replica per node)."""
    count = len(inventory.hosts)
    for flag, value in (("--replicas", ask.replicas), ("--tp", ask.tp), ("--pp", ask.pp)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: needs at least 1", f"give {flag} N with N >= 1")
    replicas, pp = ask.replicas or 1, ask.pp or 1
    if count % replicas:
        raise UsageError(f"{replicas} replicas on {count} nodes: each replica takes the same number of nodes, and "
                         f"{replicas} does not divide {count}",
                         f"give --replicas a divisor of {count} ({', '.join(map(str, divisors(count)))}), or choose "
                         f"{count - count % replicas} nodes with --limit")
    per = count // replicas
    tp = ask.tp if ask.tp is not None else max(per // pp, 1)
    layout = Layout(replicas, tp, pp)
    if layout.routed:
        _replica_bounds(layout, count, recipe)
    else:
        _engine_bounds(layout, inventory, recipe)
    return layout


def _replica_bounds(layout: Layout, count: int, recipe: Recipe) -> None:
    """Replicas fill the nodes, and each is an engine within the recipe's node bounds."""
    per = layout.nodes_per_replica
    if layout.nodes != count:
        raise UsageError(f"{layout.replicas} replicas of TP {layout.tp} x PP {layout.pp} take {layout.nodes} nodes, "
                         f"and the selection has {count}",
                         f"give --tp/--pp whose product is {count // layout.replicas} (the nodes per replica)")
    if recipe.min_nodes and per < recipe.min_nodes:
        raise UsageError(f"recipe {recipe.name} needs at least {recipe.min_nodes} nodes per engine, and "
                         f"{layout.describe()} gives each replica {per}",
                         f"give --replicas {count // recipe.min_nodes} or fewer")
    if recipe.max_nodes and per > recipe.max_nodes:
        raise UsageError(f"recipe {recipe.name} runs an engine on at most {recipe.max_nodes} node(s), and "
                         f"{layout.describe()} gives each replica {per}",
                         f"give --replicas {count // recipe.max_nodes}")


def _engine_bounds(layout: Layout, inventory: Inventory, recipe: Recipe) -> None:
    """One engine runs within the recipe's node bounds, on exactly TP x PP nodes: the selection."""
    count, tp, pp = len(inventory.hosts), layout.tp, layout.pp
    where = f" ({recipe.source})" if recipe.source else ""
    if recipe.min_nodes and count < recipe.min_nodes:
        raise UsageError(f"recipe {recipe.name}{where} needs at least {recipe.min_nodes} nodes "
                         f"({'cluster_only: too large for one Spark' if recipe.min_nodes == 2 else 'min_nodes'}), "
                         f"and the selection has {count}",
                         f"select {recipe.min_nodes} or more nodes (inventory or --limit)")
    if recipe.max_nodes and count > recipe.max_nodes:
        names = ",".join(h.name for h in inventory.hosts[:recipe.max_nodes])
        raise UsageError(f"recipe {recipe.name}{where} runs on at most {recipe.max_nodes} node(s) "
                         f"({'solo_only' if recipe.max_nodes == 1 else 'max_nodes'}), and the selection has {count}",
                         f"choose them with --limit (e.g. --limit {names})")
    need = tp * pp
    if need > count:
        raise UsageError(f"TP {tp} x PP {pp} needs {need} GPUs, but the selection has {count} node(s) with one GPU each",
                         f"add nodes to the inventory, or give --tp/--pp whose product is {count}")
    if need < count:
        names = ",".join(h.name for h in inventory.hosts[:need])
        raise UsageError(f"TP {tp} x PP {pp} on {count} nodes: each Spark holds one GPU, so it runs on exactly "
                         f"{need} nodes", f"choose them with --limit (e.g. --limit {names}) or a group of {need}")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_launcher(given: Launcher | None, recipe: Recipe, nodes: int | None, runtime: RuntimeName | None) -> Launcher:
    """How vLLM spans the nodes when --launcher does not say: on one node vLLM alone, with no Ray and no launcher
    flag (eugr's solo mode strips the executor backend; sparkrun passes none); on more, the recipe's own tool's
    default (eugr: Ray only where its command names it; sparkrun: its runtime's launcher; ours: Ray).
    The docker runtime runs a recipe's mods in the container before vLLM starts, which only the Ray launcher's
    container allows (the native one starts vLLM as the container itself): there Ray stays."""
    if given is not None:
        return given
    if runtime == "docker" and recipe.mods:
        return "ray"
    if nodes == 1:
        return "native"
    return recipe.launcher or "ray"
