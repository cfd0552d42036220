"""`sparkcluster recipes list|show|add-registry|update`, and the recipe flags `serve` shares with `recipes show`
(--set, --trust): what a recipe becomes for each node, shown before anything connects."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from rich.markup import escape

from ..engine.cliapp import App, Connect
from ..engine.command import masked_env
from ..engine.console import err as err_console
from ..engine.console import out as console
from ..engine.errors import EXIT_FAILED, EXIT_OK, UsageError
from ..engine.report import print_json
from ..recipes import registry as recipe_registry
from ..recipes.load import bundled_names, load_recipe, merged_flags
from ..recipes.types import Inputs, Recipe
from .apikey import key_to_env
from .launch import DEFAULT_IMAGE, LAUNCHERS, Launcher, Node, ServeArgs, vllm_serve_argv
from .parallel import choose_launcher
from .serve_flags import RECIPE_FLAGS, add_serve_flags


def add_recipe_flags(p: argparse.ArgumentParser) -> None:
    """--set and --trust, as serve's (serve_flags.py)."""
    add_serve_flags(p, RECIPE_FLAGS)


def recipe_inputs(args: argparse.Namespace, tp: int | None, pp: int | None) -> Inputs:
    """Our options under the names eugr's and sparkrun's templates use, then --set."""
    options = {key: str(value) for key, value in (
        ("tensor_parallel", tp), ("pipeline_parallel", pp),
        ("port", getattr(args, "port", None)), ("served_model_name", getattr(args, "served_model_name", None)))
        if value is not None}
    return Inputs(options, dict(getattr(args, "sets", None) or []))


def load_for(args: argparse.Namespace, name: str | None, tp: int | None, pp: int | None) -> Recipe:
    """The recipe rendered with our options (`tp` and `pp`: the flags', or the layout `bench --layouts` serves)."""
    recipe = load_recipe(name or "default", recipe_inputs(args, tp, pp), nodes=tp * (pp or 1) if tp else None,
                         trust=getattr(args, "trust", False))
    for warning in recipe.warnings:
        err_console.print(f"warning: {warning}", highlight=False, markup=False)
    return recipe


def chosen(option: Any, recipe_value: Any, key: str, args: argparse.Namespace) -> Any:
    """The override order for what sparkcluster takes over from a recipe: a --set of its placeholder (already in
    the recipe's rendered value) beats our option, which beats the recipe's own value."""
    sets = dict(getattr(args, "sets", None) or [])
    return recipe_value if key in sets else (option if option is not None else recipe_value)


def cmd_show(args: argparse.Namespace, connect: Connect) -> int:
    recipe = load_for(args, args.recipe, args.tp, args.pp)
    doc = shown(recipe, args)
    if args.json:
        print_json(doc)
        return EXIT_OK
    console.print(f"{escape(recipe.name)} ({recipe.format}, from {escape(recipe.source or 'bundled')})"
                  f"{' registry ' + recipe.registry + (' (trusted)' if recipe.trusted else ' (untrusted)') if recipe.registry else ''}",
                  highlight=False)
    console.print(f"  model {escape(doc['model'])}, image {escape(doc['image'])}, TP {doc['tp']} x PP {doc['pp']} = "
                  f"{doc['nodes']} node(s), launcher {doc['launcher']}", highlight=False)
    for mod in doc["mods"]:
        console.print(f"  mod {mod['name']}: {escape(mod['from'])} (recipe: {escape(mod['given'])})", highlight=False)
    for name, value in doc["env"].items():
        console.print(f"  env {name}={value}", highlight=False, markup=False)
    for rank, line in enumerate(doc["commands"]):
        console.print(f"  rank {rank}: {line}", highlight=False, markup=False, soft_wrap=True)
    return EXIT_OK


def shown(recipe: Recipe, args: argparse.Namespace) -> dict[str, Any]:
    """What each rank runs: the same lines serve builds, with placeholder addresses (no inventory is read)."""
    model = getattr(args, "model", None) or recipe.model
    if not model:
        raise UsageError(f"recipe {recipe.name!r} names no model", "name one: --model ORG/NAME")
    pp = chosen(args.pp, recipe.pp, "pipeline_parallel", args) or 1
    tp = chosen(args.tp, recipe.tp, "tensor_parallel", args) or 1
    # no runtime is known here: the launcher serve takes on the host runtime (docker with mods keeps Ray)
    launcher: Launcher = choose_launcher(args.launcher, recipe, tp * pp, None)
    flags, env = key_to_env(merged_flags(recipe, tuple(getattr(args, "remote", None) or ())), recipe.env)
    serve = ServeArgs(model, tp, pp, recipe.port or 8000, recipe.served_model_name or model, flags, env)
    nnodes = tp * pp
    nodes = [Node(f"node{r}", r, f"<node{r} fabric ip>", "<head fabric ip>") for r in range(nnodes)]
    lines = [shlex.join(vllm_serve_argv(serve, launcher, n, nnodes)) for n in nodes]
    if launcher == "ray":
        lines = lines[:1] + ["(a Ray worker: vLLM's ranks are placed by Ray)"] * (nnodes - 1)
    return {"name": recipe.name, "format": recipe.format, "source": recipe.source, "registry": recipe.registry,
            "trusted": recipe.trusted, "model": model, "image": recipe.container or DEFAULT_IMAGE, "tp": tp, "pp": pp,
            "nodes": nnodes, "launcher": launcher, "env": masked_env(env),
            "mods": [{"name": m.name, "from": str(m.path), "given": m.given} for m in recipe.mods],
            "commands": lines, "warnings": list(recipe.warnings)}


def cmd_list(args: argparse.Namespace, connect: Connect) -> int:
    rows: list[tuple[str, str, str | None]] = [] if args.registry else [("bundled", n, None) for n in bundled_names()]
    rows += [(reg, ref, str(path)) for reg, ref, path in recipe_registry.listing(args.registry)]
    if args.json:
        print_json({"recipes": [{"registry": r, "name": n, "file": f} for r, n, f in rows]})
        return EXIT_OK
    for reg, name, _ in rows:
        console.print(f"{name}  ({reg})", highlight=False, markup=False)
    return EXIT_OK


def cmd_add_registry(args: argparse.Namespace, connect: Connect) -> int:
    reg, said = recipe_registry.add(args.name, args.url, args.trust)
    try:
        count = f"{len(recipe_registry.recipe_files(reg))} recipe(s)"
    except UsageError as e:  # a manifest pointing out of its clone: recorded, and skipped until it is fixed
        err_console.print(f"warning: {e.message} ({e.fix})", highlight=False, markup=False)
        count = "skipped (see the warning)"
    console.print(f"registry {reg.name}: {said}, {count}, {'trusted' if reg.trusted else 'not trusted'} "
                  f"(clone: {reg.clone})", highlight=False, markup=False)
    return EXIT_OK


def cmd_remove_registry(args: argparse.Namespace, connect: Connect) -> int:
    reg = recipe_registry.remove(args.name)
    if args.json:
        print_json({"registry": reg.name, "removed": True, "clone": str(reg.clone)})
    else:
        console.print(f"registry {reg.name}: removed, and its clone {reg.clone}", highlight=False, markup=False)
    return EXIT_OK


def cmd_update(args: argparse.Namespace, connect: Connect) -> int:
    results = recipe_registry.update()
    for name, synced in results.items():
        print(f"{name}: {synced.said}", file=sys.stdout if synced.ok and "keeping" not in synced.said else sys.stderr)
    return EXIT_OK if all(s.ok for s in results.values()) else EXIT_FAILED


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    r = commands.add_parser("recipes", help="bundled and registry recipes (eugr v1, sparkrun v2, sparkcluster's own)")
    sub = r.add_subparsers(dest="recipes_command", metavar="RECIPES_COMMAND", required=True)
    ls = sub.add_parser("list", help="bundled and registry recipes together")
    ls.add_argument("--registry", help="only this registry's recipes")
    ls.add_argument("--json", action="store_true", help="one JSON document")
    app.wire(ls, cmd_list)
    show = sub.add_parser("show", help="what each node would run for a recipe (NAME, @REG/NAME or FILE)")
    show.add_argument("recipe")
    show.add_argument("--model", help="ORG/NAME[@REVISION] or a path on the nodes, as serve takes it (default: the "
                                      "recipe's; `default` names none)")
    show.add_argument("--tp", type=int, help="tensor parallel size (default: the recipe's)")
    show.add_argument("--pp", type=int, help="pipeline parallel size (default: the recipe's, else 1)")
    show.add_argument("--launcher", choices=LAUNCHERS, help="ray or native (default: none on one node, else the recipe's tool's, else ray)")
    show.add_argument("--port", type=int, help=argparse.SUPPRESS)
    show.add_argument("--served-model-name", help=argparse.SUPPRESS)
    show.add_argument("--json", action="store_true", help="one JSON document")
    add_recipe_flags(show)
    app.wire(show, cmd_show)
    add = sub.add_parser("add-registry", help="clone a git repository of recipes under the user's cache")
    add.add_argument("name")
    add.add_argument("url", metavar="GIT_URL_OR_PATH")
    add.add_argument("--trust", action="store_true", help="its recipes' mods may run on the nodes")
    app.wire(add, cmd_add_registry)
    rm = sub.add_parser("remove-registry", help="forget a registry and delete its clone (sparkrun's: remove them "
                                                "with sparkrun)")
    rm.add_argument("name")
    rm.add_argument("--json", action="store_true", help="one JSON document")
    app.wire(rm, cmd_remove_registry)
    up = sub.add_parser("update", help="pull every registry (a failure keeps the last good copy)")
    app.wire(up, cmd_update)
