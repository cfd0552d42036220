"""How many nodes a serve takes: tensor parallel x pipeline parallel = the nodes selected, one GPU per Spark.
A recipe's TP and PP are the defaults when --tp and --pp are not given; its node bounds (eugr's
cluster_only/solo_only, sparkrun's min_nodes/max_nodes) are checked here, before anything connects."""

from __future__ import annotations

from ..engine.errors import UsageError
from ..engine.inventory import Inventory
from ..recipes.types import Recipe
from .launch import Launcher, RuntimeName
from .layout import Layout, choose_layout


def check_layout(replicas: int | None, tp: int | None, pp: int | None, inventory: Inventory,
                 recipe: Recipe) -> Layout:
    """The layout for the selected nodes: one engine as check_parallel says, or replicas that divide the nodes
    (serving/layout.py); refused with the fix when it cannot serve this recipe."""
    if not replicas or replicas == 1:
        return Layout(1, *check_parallel(tp, pp, inventory, recipe))
    layout = choose_layout(len(inventory.hosts), replicas, tp, pp)
    # A recipe's node bounds are an engine's: each replica is one (solo_only serves one replica per node).
    per = layout.nodes_per_replica
    if recipe.min_nodes and per < recipe.min_nodes:
        raise UsageError(f"recipe {recipe.name} needs at least {recipe.min_nodes} nodes per engine, and "
                         f"{layout.describe()} gives each replica {per}",
                         f"give --replicas {len(inventory.hosts) // recipe.min_nodes} or fewer")
    if recipe.max_nodes and per > recipe.max_nodes:
        raise UsageError(f"recipe {recipe.name} runs an engine on at most {recipe.max_nodes} node(s), and "
                         f"{layout.describe()} gives each replica {per}",
                         f"give --replicas {len(inventory.hosts) // recipe.max_nodes}")
    return layout


def check_parallel(tp: int | None, pp: int | None, inventory: Inventory, recipe: Recipe) -> tuple[int, int]:
    """(TP, PP) for the selected nodes; refused with the fix when they cannot serve this recipe."""
    count = len(inventory.hosts)
    for flag, value in (("--tp", tp), ("--pp", pp)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: needs at least 1", f"give {flag} N with N >= 1")
    pp = pp or 1
    tp = tp if tp is not None else max(count // pp, 1)
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
    return tp, pp


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
