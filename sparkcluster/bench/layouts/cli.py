"""`bench --layouts tp,pp,replicas`: serve's own options (--model/--recipe, --runtime, --launcher, vLLM flags after
--), the method's plan (methods.py: the closed loop's, or --method llama-benchy's), every layout sized on the
selected nodes and the state of an earlier run read before anything connects; then the run (run.py) and one table of the layouts side by side (report.py), or --json. The results (each layout with
its receipt, which `bench --explain DIR/layouts.json:KIND` reads) and the resume state lie in --out DIR."""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ... import __version__
from ...engine.cliapp import Connect
from ...engine.console import err as err_console
from ...engine.console import out as console
from ...engine.console import print_error
from ...engine.errors import EXIT_INTERRUPTED, EXIT_OK, SparkclusterError, UsageError
from ...engine.inventory import Inventory
from ...engine.localfiles import write_text
from ...engine.report import print_json
from ...serving import render
from ...serving.apikey import figure_inputs, figure_set
from ...serving.cli import one_at_a_time, options, sized
from ...serving.phases import hub_model
from ...serving.progress import ignore as serve_quietly
from ...serving.recipes_cli import add_recipe_flags
from ...serving.serve_flags import RECIPE_FLAGS, add_serve_flags
from ...serving.serve_flags import given as serve_given
from ...serving.serve_flags import words as serve_words
from ..flagset import FlagSet
from . import choice, report, state
from .methods import LayoutsMethod
from .run import Planned, measure_layouts, measure_on, serve_on, stage_once

# serve's flags that bench takes for --layouts (serving/serve_flags.py): given without --layouts they would do nothing.
SERVE_FLAGS = ("recipe", "runtime", "launcher", "image", "docker_arg", "up_timeout", "ready_timeout", "verify")
# how --layouts words them where "as serve's" does not say it
LAYOUTS_HELP = {"recipe": "with --layouts: the recipe to serve, as serve's --recipe",
                "up_timeout": "with --layouts: as serve's --up-timeout (default 180)",
                "ready_timeout": "with --layouts: as serve's --ready-timeout (default 1800)",
                "verify": "with --layouts: skip the NCCL probe before each layout's vLLM starts"}
DEFAULT_OUT = "bench-layouts"
RESULTS_FILE = "layouts.json"


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--layouts: serve each layout in turn and measure it the same way")
    g.add_argument("--layouts", nargs="+", metavar="KIND",
                   help="tp, pp and/or replicas (space- or comma-separated): serve each on the selected nodes (TP = "
                        "the nodes, PP = the nodes, one replica per node behind the router), measure it with the "
                        "method's flags (the sustained sweep's, or --method llama-benchy's), and print them side by side with the best layout per concurrency marked. "
                        "--model is then the model to serve (default: the recipe's, else the inventory's first `models:` "
                        "entry, as serve's); extra vLLM flags go after --. The results and the "
                        f"resume state go to --out DIR (default ./{DEFAULT_OUT}): the same command again measures "
                        "only the layouts not measured yet")
    add_serve_flags(g, SERVE_FLAGS, lambda flag: LAYOUTS_HELP.get(flag.dest, f"with --layouts: as serve's {flag.option}"))
    add_recipe_flags(p)


def check_flags(args: argparse.Namespace, one_endpoint: FlagSet) -> None:
    """Without --layouts, serve's flags would be ignored; with it, `one_endpoint`'s, the flags of a one-endpoint
    measurement (bench's cli.py: --url, --compare, --csv, --plot, --profile)."""
    if not args.layouts:
        if serve_flags := serve_given(args, (*SERVE_FLAGS, *RECIPE_FLAGS)):
            raise UsageError(f"{', '.join(serve_flags)}: serve's flags, which bench reads only with --layouts (it "
                             "measures what is served)",
                             "add --layouts KIND,... to serve and measure each layout, or serve first and bench then")
        return
    if others := one_endpoint.given(args):
        raise UsageError(f"{', '.join(others)} with --layouts: --layouts serves each layout itself and measures it "
                         "with bench's method", "leave them out, or bench one served layout without --layouts")


def inputs(args: argparse.Namespace, inventory: Inventory, method: LayoutsMethod, plan: object) -> dict[str, Any]:
    """What the figures depend on: a state measured otherwise is refused rather than resumed. No secret: the state
    is a file of the working folder, and a key is no figure input (apikey.figure_inputs)."""
    return {"inventory": str(inventory.path), "nodes": [h.name for h in inventory.hosts],
            "cluster": state.cluster(inventory), "model": args.model,
            "recipe": args.recipe, "sets": [list(figure_set(*s)) for s in args.sets],
            "vllm_flags": list(figure_inputs(args.remote)),
            "runtime": args.runtime, "launcher": args.launcher, "image": args.image, **method.inputs(plan)}


def serve_hint(args: argparse.Namespace, item: Planned) -> str:
    """The `serve` line that serves a measured layout as it was measured (choice.serve_line): with what bench was
    given that serve takes too, and the model it served (--model, else the inventory's where the recipe names none)."""
    flags: list[str] = []
    inventory = getattr(args, "inventory_arg", None) or args.inventory
    flags += ["-i", inventory] if inventory else []
    flags += ["--limit", args.limit] if args.limit else []
    flags += serve_words(args, ("recipe",))
    flags += ["--model", item.options.model] if item.options.model else []
    flags += serve_words(args, ("sets", "trust", "runtime", "launcher", "image", "docker_arg", "verify", "up_timeout",
                                "ready_timeout"))
    line, variables = choice.serve_line(item.layout, flags, args.remote)
    return f"`{line}`" + (f" (with {', '.join(variables)} set: a secret's value is never printed)" if variables else "")


def cmd(args: argparse.Namespace, connect: Connect, method: LayoutsMethod) -> int:
    kinds = choice.parse_kinds(args.layouts)
    plan = method.plan(args)  # the method's flags checked, as for one endpoint
    out = Path(args.out or DEFAULT_OUT)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file", "give a directory for the results and the resume state")
    planned: list[Planned] = []
    states: list[state.LayoutState] = []

    def check(inventory: Inventory) -> None:
        """Every layout sized as serve sizes it, and the state read, before anything connects."""
        for kind, layout in zip(kinds, choice.layouts_for(kinds, len(inventory.hosts)), strict=True):
            with choice.refused_as(kind, layout):  # serve's options for this layout (its recipe rendered with them)
                planned.append(Planned(kind, layout, sized(options(args, layout), inventory,
                                                           show=not planned and not args.json)))
        hub_model(planned[0].options.serve_args())  # a bad model or revision fails here, before any connection
        states.append(state.load(out / state.STATE_FILE, inputs(args, inventory, method, plan)))

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    serve_emit = serve_quietly if args.json else render.progress_printer(err_console)
    code, stage_s, failure = EXIT_OK, 0.0, None
    say: Callable[[str], None] = (lambda text: None) if args.json else (
        lambda text: err_console.print(text, highlight=False, markup=False))
    try:
        with connect(args, check) as session, one_at_a_time(session):
            layout_state = states[0]
            todo = [item for item in planned if item.kind not in layout_state.done]
            if todo:
                stage_s = stage_once(session, todo, serve_emit)
            measure_layouts(planned, layout_state, serve_on(session, serve_emit), measure_on(session, method, plan, args),
                            say)
    except SparkclusterError as e:
        if not states:  # refused before anything connected: nothing measured to show
            raise
        failure, code = e, e.exit_code
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    measured = [states[0].done[item.kind] for item in planned if states and item.kind in states[0].done]
    doc = report.document(measured, config(args, planned, method.config(plan), started), stage_s)
    if measured:
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / RESULTS_FILE, json.dumps(doc, indent=1) + "\n")  # a link planted there is replaced
    if failure:
        doc["error"] = {"message": failure.message, "fix": failure.fix}
    if args.json:
        print_json(doc)
    elif measured:
        show(measured, planned, method.concurrency(plan), doc, out, args)
    if failure:
        kept = (f"; the layouts measured are kept in {out}: the same command again measures only the rest"
                if measured else "")
        print_error(failure.message, failure.fix + kept)
    elif code == EXIT_INTERRUPTED:
        err_console.print(f"interrupted: {len(measured)} of {len(planned)} layouts measured (kept in {out}: run the "
                          "same command again to measure the rest)", highlight=False)
    return code


def config(args: argparse.Namespace, planned: list[Planned], method: dict[str, Any], started: str) -> dict[str, Any]:
    first = planned[0].options if planned else None
    return {"model": first.serve_args().model if first else args.model, "recipe": first.recipe.name if first else None,
            "runtime": first.runtime if first else None,
            "launchers": {item.kind: item.options.launcher for item in planned},
            "method": method,
            "client": f"sparkcluster {__version__}, aiohttp {version('aiohttp')}", "started": started}


def show(measured: list[state.Measured], planned: list[Planned], concurrency: tuple[int, ...], doc: dict[str, Any],
         out: Path, args: argparse.Namespace) -> None:
    console.print(report.render(measured, concurrency, f"{doc['config']['model']}: each layout measured the "
                                                             "same way (generation tok/s is all streams' output)"))
    for m in measured:
        console.print(f"{m.layout} ({m.shape.describe()}): served in {m.serve_s:.0f} s, measured in {m.measure_s:.0f} s",
                      highlight=False, markup=False)
    if doc["cpu_vllm"]:
        console.print(f"[bold yellow]note:[/] {doc['cpu_vllm']}", highlight=False)
    best = doc["best"]
    if best:
        items = {item.kind: item for item in planned}
        winners = dict.fromkeys(best.values())
        console.print("serve the best: " + "; ".join(
            f"{kind} at c={','.join(c for c, k in best.items() if k == kind)}: {serve_hint(args, items[kind])}"
            for kind in winners if kind in items), highlight=False, markup=False, soft_wrap=True)
    console.print(f"results, each layout with the receipt of its measurement: {out / RESULTS_FILE}; the resume "
                  f"state: {out / state.STATE_FILE}", highlight=False, markup=False)
    if len(measured) > 1:
        first, second = (f"{out / RESULTS_FILE}:{m.layout}" for m in measured[:2])
        console.print(f"why two layouts' figures differ: sparkcluster bench --explain {first} {second}",
                      highlight=False, markup=False)
