"""The two sides `bench --explain` lines up, from files: a result written by `bench --json` (either method) with its
receipt read as facts and its rows as numbers, one layout of a `bench --layouts` result (`layouts.json:tp`: that
layout's receipt and rows), or a recipe's published `reference:` rows with what the recipe says it ran and what it
never recorded. Bad input is a UsageError naming what is wrong and the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...engine.errors import UsageError
from ...engine.localfiles import read_json
from ...recipes.command import canonical
from ...recipes.load import load_recipe
from ...recipes.types import Recipe
from ...serving.layout import LAYOUT_KINDS, Layout
from ..receipt import Receipt
from .facts import LAYOUT_FLAGS, Cause, Fact, flag_facts, layout_facts, receipt_facts

MAX_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class Side:
    name: str  # the file, or the published row's source
    facts: Mapping[str, Fact]
    unknown_groups: frozenset[str]  # receipt fields this side cannot know (or never recorded)
    numbers: Mapping[str, Mapping[str, float]]  # row ("c=4", "pp64 tg16 @ d0 c1") -> figure -> value
    published: bool = False
    layout: str | None = None  # one layout of a `bench --layouts` result: its kind (tp, pp, replicas)


_FIX = "give a file written by `sparkcluster bench --json` (either method) or one layout of `bench --layouts`' " \
       "(DIR/layouts.json:tp), or compare with a published row: --explain RESULT --compare RECIPE"
_SUSTAINED = (("generation_tps", "generation tok/s"), ("prefill_tps", "prefill tok/s"), ("peak_tps", "peak tok/s"))
_BENCHY = (("tg_throughput", "tg t/s"), ("pp_throughput", "pp t/s"), ("ttfr", "ttfr ms"))


def _figure(value: object) -> float | None:
    """A number of the file as a float, None for anything else; OverflowError for an integer no float holds."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _object(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _entries(items: Sequence[object], shown: str, field: str) -> list[Mapping[str, Any]]:
    """A result's rows (or llama-benchy's benchmarks) are objects: anything else is no result of ours."""
    if not all(isinstance(item, dict) for item in items):
        raise UsageError(f"{shown}: its `{field}` hold something other than objects, so it is not a bench result", _FIX)
    return [item for item in items if isinstance(item, dict)]


def _sustained_numbers(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        found = {label: _figure(row.get(key)) for key, label in _SUSTAINED}
        found |= {label: _figure(_object(row.get(key)).get("mean"))
                  for key, label in (("ttft_s", "TTFT mean s"), ("itl_s", "ITL mean s"))}
        out[f"c={row.get('concurrency')}"] = {label: v for label, v in found.items() if v is not None}
    return out


def _benchy_numbers(benchmarks: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for b in benchmarks:
        phase = " (context load)" if b.get("is_context_prefill_phase") else ""
        row = f"pp{b.get('prompt_size')} tg{b.get('response_size')} @ d{b.get('context_size')} " \
              f"c={b.get('concurrency')}{phase}"
        found = {label: _figure(_object(b.get(key)).get("mean")) for key, label in _BENCHY}
        out[row] = {label: v for label, v in found.items() if v is not None}
    return out


def _ceiling(doc: Mapping[str, Any], numbers: Mapping[str, Mapping[str, float]]) -> list[Fact]:
    """The decode ceiling (memory bandwidth over bytes per token) and the c=1 row's share of it."""
    limit = _figure(_object(_object(doc.get("config")).get("decode_ceiling")).get("tokens_per_s"))
    if limit is None or not limit > 0:
        return []
    out = [Fact("decode ceiling tok/s", Cause.CEILING, limit, "ceiling",
                "memory bandwidth over the bytes each token reads: no engine decodes one stream faster")]
    single = numbers.get("c=1", {}).get("generation tok/s")
    if single is not None:
        out.append(Fact("c=1 share of the ceiling", Cause.CEILING, single / limit, "ceiling",
                        "how close one stream came to the memory ceiling", share=True))
    return out


def _file_and_layout(spec: str) -> tuple[str, str | None]:
    """`RESULT:KIND` names one layout of a `bench --layouts` result; a file whose own name ends so is read whole."""
    path, colon, kind = spec.rpartition(":")
    if colon and kind in LAYOUT_KINDS and not Path(spec).exists():
        return path, kind
    return spec, None


def _read(path: str, shown: str) -> Any:
    """A regular file of at most MAX_FILE_BYTES that parses (engine/localfiles.py), or exit 2 naming it."""
    return read_json(Path(path), shown, "a bench result (a CSV carries no receipt)", _FIX, MAX_FILE_BYTES)


def _layout_entry(doc: Mapping[str, Any], path: str, kind: str | None, shown: str) -> tuple[dict[str, Any], str]:
    """The entry of the layout named in a `bench --layouts` result (its rows and its receipt), and the layout as
    shown: `tp (TP 2 x PP 1)`."""
    entries = {e["layout"]: e for e in doc["layouts"] if isinstance(e, dict) and isinstance(e.get("layout"), str)}
    held = ", ".join(map(str, entries)) or "none"
    example = " ".join(f"{path}:{k}" for k in list(entries)[:2]) or f"{path}:tp"
    if kind is None:
        raise UsageError(f"{shown} is a `bench --layouts` result (layouts {held}): it needs the layout named",
                         f"name a layout after the file, e.g. --explain {example}")
    entry = entries.get(kind)
    if entry is None:
        raise UsageError(f"{shown}: {path} holds no layout {kind} (it holds {held})",
                         f"name a layout it holds, e.g. --explain {example}")
    if entry.get("receipt") is None:
        raise UsageError(f"{shown}: layout {kind} was measured without a receipt (by a sparkcluster before "
                         "`bench --layouts` kept them)", "measure it again: `bench --layouts` with another --out")
    try:
        return entry, f"{kind} ({Layout.from_json(entry['shape']).describe()})"
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{shown}: layout {kind}'s shape cannot be read ({e})",
                         "give the layouts.json `bench --layouts` wrote, unedited") from None


def load_result(spec: str) -> Side:
    """A result file with its receipt, or `FILE:KIND` for a layout of a `bench --layouts` result; UsageError (exit
    2) naming what is wrong otherwise."""
    shown = f"--explain {spec}"
    path, kind = _file_and_layout(spec)
    doc, layout = _read(path, shown), None
    if isinstance(doc, dict) and isinstance(doc.get("layouts"), list):
        doc, layout = _layout_entry(doc, path, kind, shown)
    elif kind is not None:
        raise UsageError(f"{shown}: {path} is not a `bench --layouts` result, so it holds no layout {kind}",
                         f"give the file alone (--explain {path} ...), or a layouts.json `bench --layouts` wrote")
    if not isinstance(doc, dict) or not (isinstance(doc.get("rows"), list) or isinstance(doc.get("benchmarks"), list)):
        raise UsageError(f"{shown} is not a bench result (it holds neither `rows` nor `benchmarks`)", _FIX)
    found = doc.get("receipt") or _object(doc.get("sparkcluster")).get("receipt")
    if found is None:
        raise UsageError(f"{shown} holds no receipt: it was written by a bench without receipts, or by "
                         "llama-benchy itself", "measure again with this sparkcluster's `bench --json`, or compare "
                         "it with a published row: --explain RESULT --compare RECIPE")
    try:
        receipt = Receipt.from_json(found)
    except ValueError as e:
        raise UsageError(f"{shown}: its receipt cannot be read: {e}", "measure again with this sparkcluster's "
                         "`bench --json`") from None
    try:
        numbers = (_sustained_numbers(_entries(doc["rows"], shown, "rows")) if isinstance(doc.get("rows"), list)
                   else _benchy_numbers(_entries(doc["benchmarks"], shown, "benchmarks")))
        ceiling = _ceiling(doc, numbers)
    except OverflowError:
        raise UsageError(f"{shown}: a figure of it is a number no float holds (hundreds of digits), so it is not a "
                         "bench result", _FIX) from None
    facts, unknown = receipt_facts(receipt)
    facts += ceiling
    if layout is not None:
        facts += layout_facts(layout, receipt)
    return Side(spec, {f.key: f for f in facts}, frozenset(unknown), numbers, layout=kind)


# What a recipe's published rows never record, by the receipt's fields: a recipe says its model, flags and image
# (its flags are what it asks for, not a command line as launched), its rows the node count and hardware.
NEVER_RECORDED = {
    "engine.vllm_version": "the vLLM version", "engine.image": "the image", "engine.image_id": "the image's ID",
    "engine.image_digest": "the image's digest", "engine.python_env": "the Python environment",
    "engine.recipe": "the recipe's sha256 and its mods'", "engine.runtime": "the runtime",
    "engine.launcher": "the launcher", "engine.tp": "tp", "engine.pp": "pp", "engine.replicas": "replicas",
    "nodes": "each node's kernel, driver, BIOS, ConnectX firmware, NCCL", "comm_env": "the comm env",
    "metrics": "speculative acceptance, prefix-cache hit rate, preemptions (the engine's /metrics)",
    "bench": "the bench's parameters and its prompt set", "sparkcluster": "the client that measured",
    "endpoint": "the endpoint", "ceiling": "the decode ceiling",
}


def published_side(recipe: Recipe) -> Side:
    """A recipe's `reference:` rows with what the recipe says it ran: its model, flags and image."""
    reference = recipe.reference
    if reference is None:
        raise UsageError(f"recipe {recipe.source or recipe.name} has no published reference rows",
                         "compare with a recipe that has `reference:` (gpt-oss-120b), or add one to your file")
    facts = flag_facts({k: v for k, v in recipe.flags.items() if canonical(k) not in LAYOUT_FLAGS},
                       "engine.command")
    facts.append(Fact("model", Cause.LAYOUT, recipe.model, "engine.command", "what is served"))
    if recipe.container:
        facts.append(Fact("image", Cause.VERSIONS, recipe.container, "engine.image",
                          "a tag names whatever was built last under it"))
    numbers = {f"c={row['concurrency']}": {label: float(row[key]) for key, label in _SUSTAINED if key in row}
               for row in reference.rows}
    nodes = f"{reference.nodes} node{'s' if reference.nodes != 1 else ''}"
    never = set(NEVER_RECORDED) - ({"engine.image"} if recipe.container else set())
    return Side(f"published: {reference.source} ({reference.hardware}, {nodes})", {f.key: f for f in facts},
                frozenset(never), numbers, True)



def sides(results: Sequence[str], compare: str | None) -> tuple[Side, Side]:
    """`--explain A B`, `--explain A --compare RESULT` or `--explain A --compare RECIPE` (its published rows)."""
    if len(results) > 2 or (len(results) == 2 and compare):
        raise UsageError("--explain compares two results: " + " and ".join([*results, *([compare] if compare else [])]),
                         "give --explain A B, or --explain A --compare RECIPE")
    if len(results) == 1 and not compare:
        raise UsageError(f"--explain {results[0]} needs something to compare with",
                         "give a second result (--explain A B), or a recipe's published rows (--compare RECIPE)")
    first = load_result(results[0])
    if len(results) == 2:
        return first, load_result(results[1])
    assert compare is not None
    if Path(compare).suffix.lower() in (".json", ".csv"):
        return first, load_result(compare)
    return first, published_side(load_recipe(compare, trust=True))  # its rows only: nothing of it runs
