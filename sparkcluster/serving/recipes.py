"""Serving recipes: named YAML files of vLLM flags and environment (recipes/), overridable flag by flag
with the extra arguments after `--`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..engine import yamlsource
from ..engine.errors import UsageError, did_you_mean
from . import recipe_values

BUNDLED = resources.files("sparkcluster") / "recipes"
KEYS = {"description", "model", "served_model_name", "port", "env", "flags", "reference"}
# Published figures a recipe may carry (`sparkcluster bench --compare`): per-concurrency rows, rates in tok/s,
# latencies as means in seconds.
REFERENCE_KEYS = {"source", "hardware", "nodes", "rows"}
REFERENCE_FIGURES = {"prefill_tps", "generation_tps", "peak_tps", "total_tps", "ttft_s", "itl_s", "e2e_s"}
# Flags sparkcluster sets itself from its own options: given twice, vLLM would take the last one silently.
OWNED_FLAGS = {
    "--tensor-parallel-size": "--tp", "-tp": "--tp", "--port": "--port", "--host": "(always 0.0.0.0)",
    "--served-model-name": "--served-model-name", "--distributed-executor-backend": "--launcher",
    "--nnodes": "--launcher native", "--node-rank": "--launcher native", "--master-addr": "--launcher native",
    "--master-port": "--launcher native", "--headless": "--launcher native",
}


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str = ""
    model: str | None = None
    served_model_name: str | None = None
    port: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, str | None] = field(default_factory=dict)  # None: a bare flag
    reference: Reference | None = None


@dataclass(frozen=True)
class Reference:
    """Published rows measured with this recipe, and where and on what they were measured."""

    source: str
    hardware: str
    nodes: int
    rows: tuple[Mapping[str, float], ...]  # each with `concurrency` and some of REFERENCE_FIGURES


def bundled_names() -> list[str]:
    return sorted(p.name[:-4] for p in BUNDLED.iterdir() if p.name.endswith(".yml"))


def load_recipe(name_or_path: str) -> Recipe:
    """A bundled recipe by name, or a recipe file by path; every error names the fix."""
    path = Path(name_or_path)
    if name_or_path.endswith((".yml", ".yaml")) or path.is_file():
        if not path.is_file():
            raise UsageError(f"recipe file {name_or_path} does not exist", "give a bundled name or an existing file")
        text, shown, name = _read_file(path), name_or_path, path.stem
    else:
        names = bundled_names()
        if name_or_path not in names:
            raise UsageError(f"no recipe named {name_or_path!r}{did_you_mean(name_or_path, names)}",
                             f"bundled recipes: {', '.join(names)}; or give a path to a .yml file")
        text, shown, name = (BUNDLED / f"{name_or_path}.yml").read_text(), f"recipe {name_or_path}", name_or_path
    try:
        doc = yamlsource.load(text) or {}
    except yamlsource.YamlError as e:
        raise UsageError(f"{shown}:{e.line}: {e.problem}", e.fix) from None
    return _recipe(name, shown, doc)


def _read_file(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"recipe file {path}: cannot read it: {e.strerror}", "check the file's permissions") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UsageError(f"{path}:{line}: the recipe is not UTF-8 text", "save it as UTF-8") from None


def _recipe(name: str, shown: str, doc: object) -> Recipe:
    doc = recipe_values.top_level(doc, shown, KEYS)
    flags = recipe_values.flags(doc, shown, OWNED_FLAGS)
    env = recipe_values.env(doc, shown)
    port = recipe_values.port(doc, shown)
    text = {key: recipe_values.text(doc, key, shown) for key in ("description", "model", "served_model_name")}
    return Recipe(name, text["description"] or "", text["model"], text["served_model_name"], port, env, flags,
                  _reference(shown, doc["reference"], _line(doc, "reference")) if "reference" in doc else None)


def _line(doc: object, key: str) -> int:
    return doc.key_line(key) if hasattr(doc, "key_line") else 0  # a SourceMap from yamlsource knows its lines


def _reference(shown: str, ref: object, line: int) -> Reference:
    """`reference:` checked like the rest, each problem at its file:line."""
    fix = "reference: {source: TEXT, hardware: TEXT, nodes: N, rows: [{concurrency: C, generation_tps: X, ...}]}"
    if not isinstance(ref, dict) or set(ref) != REFERENCE_KEYS:
        raise UsageError(f"{shown}:{line}: reference needs exactly {', '.join(sorted(REFERENCE_KEYS))}", fix)
    nodes = ref["nodes"]
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise UsageError(f"{shown}:{_line(ref, 'nodes')}: reference nodes {nodes!r} is not a count", fix)
    rows_doc = ref["rows"]
    if not isinstance(rows_doc, list) or not rows_doc:
        raise UsageError(f"{shown}:{_line(ref, 'rows')}: reference rows must be a non-empty list", fix)
    rows = []
    for i, row in enumerate(rows_doc):
        at = f"{shown}:{rows_doc.item_line(i) if hasattr(rows_doc, 'item_line') else line}"
        concurrency = row.get("concurrency") if isinstance(row, dict) else None
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise UsageError(f"{at}: a reference row needs a concurrency (a positive integer)", fix)
        unknown = sorted(set(row) - REFERENCE_FIGURES - {"concurrency"})
        if unknown:
            figures = sorted(REFERENCE_FIGURES)
            raise UsageError(f"{at}: unknown figure {unknown[0]!r}{did_you_mean(unknown[0], figures)}",
                             f"figures: {', '.join(figures)}")
        # isfinite: NaN compares false with everything, so `v < 0` alone would let it pass as a published figure
        bad = [k for k, v in row.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0]
        if bad:
            raise UsageError(f"{at}: {bad[0]} {row[bad[0]]!r} is not a non-negative number", fix)
        rows.append({str(k): float(v) if k != "concurrency" else v for k, v in row.items()})
    return Reference(str(ref["source"]), str(ref["hardware"]), nodes, tuple(rows))


def parse_flags(args: Sequence[str]) -> dict[str, str | None]:
    """Extra vLLM arguments as flag -> value (None for a bare flag): `--x 1`, `--x=1`, `--flag`."""
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("-"):
            raise UsageError(f"extra vLLM argument {word!r} is not a flag",
                             "give flags after `--`, e.g. `-- --max-model-len 8192`; the model is --model")
        if "=" in word:
            key, value = word.split("=", 1)
            flags[key] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            flags[word] = args[i + 1]
            i += 1
        else:
            flags[word] = None
        i += 1
    for flag in flags:
        if flag in OWNED_FLAGS:
            raise UsageError(f"{flag} is set by sparkcluster", f"use sparkcluster's {OWNED_FLAGS[flag]}")
    return flags


def merged_flags(recipe: Recipe, extra: Sequence[str]) -> tuple[str, ...]:
    """The recipe's flags with the user's extra arguments replacing those of the same name, then the rest."""
    flags = dict(recipe.flags)
    flags.update(parse_flags(extra))
    return tuple(word for flag, value in flags.items() for word in ((flag,) if value is None else (flag, value)))
