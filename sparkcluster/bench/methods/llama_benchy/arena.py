"""A profile run's directory, in the shapes sparkrun's uploader sends to the Spark Arena:
benchmark.json (the cells merged as sparkrun merges them), benchmark.csv (llama-benchy's CSV of that),
metadata.json (sparkrun's generate_metadata keys; null where sparkcluster cannot know a value) and recipe.yaml
(the effective recipe). Each finished cell also lies in cells/ as its own llama-benchy document: a re-run
reads them and measures only the cells that are missing."""

from __future__ import annotations

import datetime
import hashlib
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from .... import __version__
from ....engine.localfiles import write_text
from ....engine.secret_names import masked_argv
from ...target import Target
from .arithmetic import BenchmarkRun
from .formats import csv_text
from .profile import Profile, consolidate
from .schedule import BenchyOptions, Cell


def cell_file(out: Path, cell: Cell) -> Path:
    """sparkrun's `_d{depth}_c{conc}` artifact suffix, plus pp and tg so a profile with several never mixes them."""
    return out / "cells" / f"benchmark_d{cell.depth}_c{cell.concurrency}_pp{cell.pp}_tg{cell.tg}.json"


def _matches(doc: object, cell: Cell) -> bool:
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list) or not doc["benchmarks"]:
        return False
    try:
        runs = [BenchmarkRun.from_json(b) for b in doc["benchmarks"]]
    except (KeyError, TypeError, ValueError):
        return False
    return all((r.context_size, r.concurrency, r.prompt_size, r.response_size)
               == (cell.depth, cell.concurrency, cell.pp, cell.tg) for r in runs)


def resume(out: Path, plan: Sequence[Cell]) -> tuple[list[dict[str, Any]], list[Cell]]:
    """The documents of the cells already measured in `out` (in plan order) and the cells still to measure.
    A cell file that does not parse, or holds another cell, is measured again."""
    done: list[dict[str, Any]] = []
    todo: list[Cell] = []
    for cell in plan:
        path = cell_file(out, cell)
        try:
            doc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict) and _matches(doc, cell):
            done.append(doc)
        else:
            todo.append(cell)
    return done, todo


def save_cell(out: Path, cell: Cell, doc: dict[str, Any]) -> None:
    """Through engine/localfiles.py, as every Arena file: Ctrl-C mid-write never leaves half a file that a resume
    would trust, and a link planted in the folder is replaced, never written through."""
    write_text(cell_file(out, cell), json.dumps(doc, indent=2))


def measured(out: Path, plan: Sequence[Cell]) -> list[dict[str, Any]]:
    return resume(out, plan)[0]


FLAG = {"tensor_parallel": "-tp", "pipeline_parallel": "-pp"}  # sparkrun's VLLM_FLAG_MAP for these two


def recipe_text(target: Target) -> str:
    """The effective recipe: a sparkrun v2 recipe of what the head's serve record says (model, image, TP x PP,
    port, flags). The record's `recipe` is only a name here: a file of that name on this machine is never read,
    since the name comes from the head and the local file (if any) is not what the head ran."""
    config = target.config
    flags = masked_argv([str(f) for f in config.get("recipe_flags") or ()])  # what the Arena publishes
    port = urlsplit(str(config.get("endpoint") or "")).port or 8000
    # Only what the record says: an endpoint given by --url has no recorded TP or PP, and "-tp None" is no recipe.
    parallel = {key: config[name] for key, name in (("tensor_parallel", "tp"), ("pipeline_parallel", "pp"))
                if isinstance(config.get(name), int)}
    # The placeholders stay bare for sparkrun to fill; the flags are quoted, so a JSON value (--speculative-config
    # '{"method": ...}') reads back as the one argument it was.
    command = " ".join(["vllm serve {model} --served-model-name {served_model_name}",
                        *(f"{FLAG[key]} {{{key}}}" for key in parallel), "--port {port}"])
    recipe: dict[str, Any] = {
        "recipe_version": "2", "model": config.get("hf_model") or target.model, "runtime": "vllm",
        "container": config.get("image"), "min_nodes": len(config.get("nodes") or ()) or 1,
        "defaults": {**parallel, "served_model_name": target.model, "port": port},
        "command": f"{command} {shlex.join(flags)}".strip(),
        "metadata": {"description": f"as served by sparkcluster (recipe: {config.get('recipe') or 'none recorded'}; "
                                    f"endpoint source: {config.get('source')})"},
    }
    return yaml.safe_dump(recipe, sort_keys=False)


def metadata(profile: Profile, target: Target, opts: BenchyOptions, started: datetime.datetime,
             ended: datetime.datetime, complete: bool, resumed: bool, recipe: str) -> dict[str, Any]:
    config = target.config
    digest = hashlib.sha256(recipe.encode()).hexdigest()
    nodes = list(config.get("nodes") or ())
    cluster: dict[str, Any] = {"cluster_id": None, "node_count": len(nodes) or None,
                               "hosts": [f"host{i + 1}" for i in range(len(nodes))], "hosts_redacted": True}
    for key in ("tp", "pp"):  # sparkrun names each parallelism only where it is not 1
        if isinstance(config.get(key), int) and config[key] != 1:
            cluster[key] = config[key]
    image = config.get("image")
    return {
        "recipe": {"name": config.get("recipe"), "qualified_name": config.get("recipe"), "type": "sparkcluster",
                   "model": target.model, "hf_model": config.get("hf_model"), "raw_container": image,
                   "container": config.get("image_id") or image, "container_pinned": bool(config.get("image_id")),
                   "text": recipe, "hash": digest, "effective_hash": digest, "runtime": config.get("runtime"),
                   "runtime_full": config.get("launcher"), "registry": None, "registry_git": None},
        "timing": {"start": started.isoformat(timespec="seconds"), "end": ended.isoformat(timespec="seconds"),
                   "duration": round((ended - started).total_seconds(), 3)},
        "cluster": cluster,
        "benchmark": {"framework": "llama-benchy", "profile": profile.name, "args": profile.args or {
            "pp": list(profile.pp), "tg": list(profile.tg), "depth": list(profile.depth),
            "concurrency": list(profile.concurrency), "runs": opts.runs, "prefix_caching": opts.prefix_caching},
            "resumed": resumed, "measured_at": started.isoformat(timespec="seconds"),
            "completed_at": ended.isoformat(timespec="seconds") if complete else None, "category": None},
        "model": {key: None for key in ("dtype", "params", "num_layers", "num_kv_heads", "head_dim",
                                        "quantization", "quant_bits", "kv_dtype", "revision")},
        "runtime_info": {},
        "sparkrun": {"version": None},
        "sparkcluster": {"version": __version__, "endpoint": config.get("endpoint"), "runs": opts.runs},
    }


def write(out: Path, profile: Profile, target: Target, opts: BenchyOptions, started: datetime.datetime,
          plan: Sequence[Cell], resumed: bool) -> int:
    """benchmark.json, benchmark.csv, metadata.json and recipe.yaml from every cell measured so far (in the
    profile's order); the number of cells they hold."""
    docs = measured(out, plan)
    merged = consolidate(docs)
    runs = [BenchmarkRun.from_json(b) for b in merged["benchmarks"]]
    recipe = recipe_text(target)
    ended = datetime.datetime.now(datetime.timezone.utc)
    write_text(out / "benchmark.json", json.dumps(merged, indent=2))
    write_text(out / "benchmark.csv", csv_text(merged["model"], runs, merged["max_concurrency"], arena=True))
    write_text(out / "metadata.json", json.dumps(metadata(profile, target, opts, started, ended, len(docs) == len(plan),
                                                      resumed, recipe), indent=2))
    write_text(out / "recipe.yaml", recipe)
    return len(docs)
