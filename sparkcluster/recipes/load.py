"""Serving recipes: named YAML files of vLLM flags and environment (recipes/), eugr's v1 and sparkrun's v2
recipe files, and registries' recipes by `@REG/NAME`, all loaded into one Recipe; overridable flag by flag with
the extra arguments after `--`.

The override order, lowest first: the recipe's defaults, sparkcluster's options (--tp, --pp, --port,
--served-model-name), `--set KEY=VALUE` (a template placeholder), then the extra flags after `--`.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from ..engine import yamlsource
from ..engine.errors import UsageError, did_you_mean
from ..engine.yamlsource import SourceMap
from . import bounds, paths, trustgate
from . import values as recipe_values
from .command import FlagValue, canonical, flag_argv, flag_words
from .community import eugr_v1, mods_base, sparkrun_v2
from .types import Inputs, Mod, ModPlace, Recipe, Reference
from .yamlfile import load_last_wins

__all__ = ["Inputs", "Mod", "Recipe", "Reference", "load_recipe", "merged_flags", "parse_flags", "bundled_names"]

BUNDLED = resources.files("sparkcluster") / "recipes" / "bundled"
KEYS = {"description", "model", "served_model_name", "port", "env", "flags", "reference", "replicas"}
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
    "--pipeline-parallel-size": "--pp", "-pp": "--pp",
}
# Keys that say a file is eugr's or sparkrun's rather than sparkcluster's own format.
COMMUNITY_KEYS = {"recipe_version", "sparkrun_version", "runtime", "container", "command", "defaults", "min_nodes",
                  "max_nodes", "mods", "metadata", "include", "overrides", "name", "build_args", "solo_only",
                  "cluster_only", "model_revision", "pre_exec", "post_exec", "post_commands", "containers",
                  "layout", "scheduler", "cluster_config", "distribution_config", "executor"}
FORMATS_FIX = ('sparkcluster recipes have flags:; eugr recipes start `recipe_version: "1"`, sparkrun recipes '
               '`recipe_version: "2"` (see docs/recipes.md, "Bringing a recipe")')


def bundled_names() -> list[str]:
    return sorted(p.name[:-4] for p in BUNDLED.iterdir() if p.name.endswith(".yml"))


def load_recipe(name_or_path: str, inputs: Inputs | None = None, *, nodes: int | None = None,
                trust: bool = False) -> Recipe:
    """A bundled recipe by name, a recipe file by path, or a registry's by `@REG/NAME`; every error names the fix.
    `inputs` fill a community recipe's template; `nodes` (when known) selects sparkrun's `overrides`. A mod from
    a registry that is not trusted is refused unless `trust`, whichever recipe names it or includes it."""
    inputs = inputs or Inputs()
    if name_or_path.startswith("@"):
        from .registry import resolve_scoped

        found = resolve_scoped(name_or_path)
        recipe = _load_file(found.path, str(found.path), found.path.stem, inputs, nodes,
                            _places(found.path, found.registry, found.trusted, found.mods_dirs))
        return _registry_recipe(recipe, found.registry, found.trusted, name_or_path, trust)
    if is_file_name(name_or_path):
        path = Path(name_or_path).expanduser()
        existing = next((c for c in (path, Path(f"{path}.yaml"), Path(f"{path}.yml")) if c.is_file()), None)
        if existing is None:
            raise UsageError(f"recipe file {name_or_path} does not exist",
                             "give a bundled name, an existing file, or @REGISTRY/NAME")
        return _load_path(existing, name_or_path if existing == path else str(existing), inputs, nodes, trust)
    names = bundled_names()
    if name_or_path in names:
        data = (BUNDLED / f"{name_or_path}.yml").read_bytes()
        recipe = _from_text(data.decode(), f"recipe {name_or_path}", name_or_path, None, inputs, nodes, ())
        return replace(recipe, sha256=hashlib.sha256(data).hexdigest())
    from .registry import resolve_unscoped

    unscoped = resolve_unscoped(name_or_path)
    if unscoped is None:
        here = next((f"./{name_or_path}{ext}" for ext in ("", ".yaml", ".yml") if Path(f"{name_or_path}{ext}").is_file()),
                    None)
        raise UsageError(f"no recipe named {name_or_path!r}{did_you_mean(name_or_path, names)}",
                         f"bundled recipes: {', '.join(names)}; or give a path to a .yml file, or @REGISTRY/NAME "
                         "(`sparkcluster recipes list`)"
                         + (f"; a file in this folder is given by its path: {here}" if here else ""))
    recipe = _load_file(unscoped.path, str(unscoped.path), unscoped.path.stem, inputs, nodes,
                        _places(unscoped.path, unscoped.registry, unscoped.trusted, unscoped.mods_dirs))
    return _registry_recipe(recipe, unscoped.registry, unscoped.trusted, f"@{unscoped.registry}/{unscoped.path.stem}",
                            trust)


def is_file_name(name: str) -> bool:
    """A recipe named as a file: a path with a slash (`./x.yaml`, `recipes/x`, `~/x.yaml`) or a name ending in
    .yaml/.yml. Any other name is a bundled or registry recipe, never a file of the working directory: a
    checkout's `default.yaml` must not pass for the bundled recipe, mods and all."""
    return "/" in name or name.endswith((".yaml", ".yml"))


def _load_path(path: Path, shown: str, inputs: Inputs, nodes: int | None, trust: bool) -> Recipe:
    """A recipe file, as trusted as the clone that really holds it: a file in a registry's clone (by its path or
    through a link) is that registry's recipe, with its trust and its mods folder; any other is the user's own."""
    from .registry import file_home

    home = file_home(path)
    recipe = _load_file(path, shown, path.stem, inputs, nodes, _places(path, home.registry, home.trusted,
                                                                        home.mods_dirs))
    if home.registry is None:
        return _refuse_untrusted(recipe, shown, trust, None, home.trusted)
    return _registry_recipe(recipe, home.registry, home.trusted, shown, trust)


def _places(path: Path, registry: str | None, trusted: bool, extra: Sequence[ModPlace]) -> tuple[ModPlace, ...]:
    """Where a recipe file's mods are looked for (beside it and up its tree, then `extra`), each folder carrying
    the trust of the registry it belongs to; a name beside it must stay inside the top of that tree."""
    bases = mods_base(path)
    return (*(ModPlace(base, registry, trusted, bases[-1], "recipe's folder") for base in bases), *extra)


def _registry_recipe(recipe: Recipe, registry: str | None, trusted: bool, shown: str, trust: bool) -> Recipe:
    return replace(_refuse_untrusted(recipe, shown, trust, registry, trusted), registry=registry,
                   trusted=trusted or trust)


def _refuse_untrusted(recipe: Recipe, shown: str, trust: bool, registry: str | None, trusted: bool) -> Recipe:
    """What a registry that is not trusted brings that would run code on every node is refused until the user says
    --trust or trusts the registry: a mod, whichever recipe named it or included it; and the environment and flags
    of a recipe that is that registry's file, or that includes one of its files (trustgate.py says which only
    tune). `registry` and `trusted` are whose the recipe's own file is."""
    if trust:
        return recipe
    untrusted = [m for m in recipe.mods if not m.trusted]
    if untrusted:
        source = untrusted[0].registry or "?"
        raise UsageError(f"{shown} brings mods from the registry {source!r}, which is not trusted "
                         f"({', '.join(m.given for m in untrusted)}), that would run code on every node",
                         _trust_fix(source))
    sources = [*([registry or "?"] if not trusted else []), *recipe.untrusted_bases]
    refused = trustgate.refusals(recipe.env, recipe.flags) if sources else []
    if refused:
        whose = (f"is from the registry {sources[0]!r}" if not trusted else
                 f"includes a base recipe from the registry {sources[0]!r}")
        raise UsageError(f"{shown} {whose}, which is not trusted, and sets what only a trusted recipe may: "
                         + "; ".join(refused), _trust_fix(sources[0]))
    return recipe


def _trust_fix(registry: str) -> str:
    return (f"read the recipe, then serve with --trust, or trust the registry: "
            f"`sparkcluster recipes add-registry {registry} URL --trust`")


def _load_file(path: Path, shown: str, name: str, inputs: Inputs, nodes: int | None,
               places: Sequence[ModPlace]) -> Recipe:
    return _from_text(_read_file(path), shown, name, path, inputs, nodes, places)


def _from_text(text: str, shown: str, name: str, path: Path | None, inputs: Inputs, nodes: int | None,
               places: Sequence[ModPlace]) -> Recipe:
    try:
        doc, repeated = load_last_wins(text)
    except yamlsource.YamlError as e:
        raise UsageError(f"{shown}:{e.line}: {e.problem}", e.fix) from None
    doc = doc if doc is not None else {}
    community = isinstance(doc, dict) and (set(doc) & COMMUNITY_KEYS) and not (set(doc) & {"flags", "reference"})
    if not community:
        if repeated:
            line = repeated[0].split(":")[0].removeprefix("line ")
            raise UsageError(f"{shown}:{line}: {repeated[0].split(': ', 1)[1].split(';')[0]}",
                             "remove one of them: sparkcluster's own recipes keep each key once")
        return _recipe(name, shown, doc)
    warnings = [f"{shown}:{w.removeprefix('line ')}" for w in repeated]
    doc, mods_places, untrusted_bases = _with_include(doc, shown, path, 0, places)
    bounds.check_render_sizes(doc, inputs, shown)

    def resolve_mod(given: str, line: int) -> Mod:
        from .mods import resolve_mod as find

        return find(given, f"{shown}:{line}", mods_places)

    version = str(doc.get("recipe_version", doc.get("sparkrun_version", "2")))
    if version == "1":
        return replace(eugr_v1(doc, shown, name, inputs, resolve_mod, warnings), untrusted_bases=untrusted_bases)
    if version == "2":
        return replace(sparkrun_v2(doc, shown, name, inputs, resolve_mod, warnings, nodes),
                       untrusted_bases=untrusted_bases)
    key = "recipe_version" if "recipe_version" in doc else "sparkrun_version"
    raise UsageError(f"{shown}:{recipe_values.key_line(doc, key)}: recipe_version {version!r} is no format "
                     "sparkcluster knows", FORMATS_FIX)


def _with_include(doc: Any, shown: str, path: Path | None, depth: int,
                  places: Sequence[ModPlace]) -> tuple[Any, Sequence[ModPlace], tuple[str, ...]]:
    """sparkrun's `include:` a base recipe beside this one, deep-merged under this file's keys. Returns the
    merged document, where its `mods:` are looked for (a list that came from the base is the base's, found
    where the base is and as trusted as the base's registry), and the registries, not trusted, whose files the
    bases are (their env, defaults and command are in the merged document)."""
    base_name = doc.get("include")
    if base_name is None:
        return doc, places, ()
    line = recipe_values.key_line(doc, "include")
    if depth > 4 or not isinstance(base_name, str):
        raise UsageError(f"{shown}:{line}: include must name one base recipe (and includes nest at most 4 deep)",
                         "write `include: BASE` for BASE.yaml beside this file")
    if base_name.startswith("@"):
        from .registry import resolve_scoped

        found = resolve_scoped(base_name)
        base_path = found.path
    else:
        base_path = _beside(base_name, path, f"{shown}:{line}")
        from .registry import file_home

        found = file_home(base_path)  # whose the base is: where it really is
    base_places: Sequence[ModPlace] = _places(base_path, found.registry, found.trusted, found.mods_dirs)
    if not base_path.is_file():
        raise UsageError(f"{shown}:{line}: the included recipe {base_name!r} is not beside this file",
                         f"put {base_name}.yaml next to it, or include @REGISTRY/NAME")
    try:
        base, _ = load_last_wins(_read_file(base_path))
    except yamlsource.YamlError as e:
        raise UsageError(f"{base_path}:{e.line}: {e.problem}", e.fix) from None
    base, base_mods_places, untrusted = _with_include(base, str(base_path), base_path, depth + 1, base_places)
    mods_from_base = isinstance(base, dict) and "mods" in base and "mods" not in doc
    untrusted = (found.registry or "?", *untrusted) if not found.trusted else untrusted
    return _deep_merge(base, doc), base_mods_places if mods_from_base else places, untrusted


def _beside(base_name: str, path: Path | None, where: str) -> Path:
    """An include's base beside the file (`base`, `base.yaml`, `base.yml`), which must stay inside the file's tree
    (its repository, its registry's clone); a recipe that is no file has nothing beside it."""
    if path is None:
        raise UsageError(f"{where}: include {base_name!r} names a file beside a recipe that is no file",
                         "include @REGISTRY/NAME")
    within = mods_base(path)[-1]
    for ext in ("", ".yaml", ".yml"):
        try:
            hit = paths.lookup(path.parent, f"{base_name}{ext}", within)
        except paths.Outside as e:
            raise UsageError(f"{where}: include {base_name!r} leads out of the recipe's folder ({e.folder}), to "
                             f"{e.found}", "include a base beside the recipe, or @REGISTRY/NAME") from None
        if hit is not None and hit.is_file():
            return path.parent / f"{base_name}{ext}"
    return path.parent / base_name


def _deep_merge(base: Any, top: Any) -> Any:
    if not (isinstance(base, dict) and isinstance(top, dict)):
        return top
    merged = SourceMap(getattr(top, "line", 1))
    for key in [*base, *(k for k in top if k not in base)]:
        if key == "include":
            continue
        value = _deep_merge(base[key], top[key]) if key in base and key in top else top.get(key, base.get(key))
        merged._set(key, value, recipe_values.key_line(top if key in top else base, key))
    return merged


def _read_file(path: Path) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(bounds.MAX_RECIPE_BYTES + 1)  # never more: a recipe is a page, whatever the file is
    except OSError as e:
        raise UsageError(f"recipe file {path}: cannot read it: {e.strerror}", "check the file's permissions") from None
    bounds.check_file_size(len(data), str(path))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UsageError(f"{path}:{line}: the recipe is not UTF-8 text", "save it as UTF-8") from None


def _recipe(name: str, shown: str, doc: object) -> Recipe:
    doc = recipe_values.top_level(doc, shown, KEYS, FORMATS_FIX)
    flags = recipe_values.flags(doc, shown, OWNED_FLAGS)
    env = recipe_values.env(doc, shown)
    port = recipe_values.port(doc, shown)
    text = {key: recipe_values.text(doc, key, shown) for key in ("description", "model", "served_model_name")}
    return Recipe(name, text["description"] or "", text["model"], text["served_model_name"], port, env, flags,
                  _reference(shown, doc["reference"], _line(doc, "reference")) if "reference" in doc else None,
                  source=shown, replicas=recipe_values.replicas(doc, shown))


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


def parse_flags(args: Sequence[str]) -> dict[str, FlagValue]:
    """Extra vLLM arguments as flag -> value (None for a bare flag): `--x 1`, `--x=1`, `--flag`, `--x a b`, read
    by the one flag reader recipes' command lines use, so that `--tensor_parallel_size` is the
    `--tensor-parallel-size` it is to vLLM."""
    if args and not args[0].startswith("-"):
        raise UsageError(f"extra vLLM argument {args[0]!r} is not a flag",
                         "give flags after `--`, e.g. `-- --max-model-len 8192`; the model is --model")
    flags = flag_words(list(args), "the extra vLLM arguments after --")
    for flag in flags:
        owner = OWNED_FLAGS.get(canonical(flag))
        if owner is not None:
            raise UsageError(f"{flag} is set by sparkcluster", f"use sparkcluster's {owner}")
    return flags


def merged_flags(recipe: Recipe, extra: Sequence[str]) -> tuple[str, ...]:
    """The recipe's flags with the user's extra arguments replacing those of the same name (by vLLM's reading:
    `--max_model_len` is `--max-model-len`), then the rest."""
    given = parse_flags(extra)
    replaced = {canonical(flag) for flag in given}
    flags: dict[str, FlagValue] = {k: v for k, v in recipe.flags.items() if canonical(k) not in replaced}
    flags.update(given)
    return flag_argv(flags)


def draft_models(flags: Sequence[str]) -> list[str]:
    """The draft model a `--speculative-config` names (DFlash, EAGLE, a small model): serving runs offline, so it
    is staged like the main model. N-gram and MTP need none."""
    import json

    for i, word in enumerate(flags):
        value = word.split("=", 1)[1] if word.startswith("--speculative-config=") else (
            flags[i + 1] if word == "--speculative-config" and i + 1 < len(flags) else None)
        if value is None:
            continue
        try:
            config = json.loads(value)
        except ValueError:
            raise UsageError(f"--speculative-config {value!r} is not JSON",
                             "write it as JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'") from None
        model = config.get("model") if isinstance(config, dict) else None
        if isinstance(model, str) and model.count("/") == 1 and not model.startswith(("/", ".", "~")):
            return [model]
    return []


def build_fix(recipe: Recipe, image: str) -> str:
    """How to get a recipe's image: eugr's build command with the recipe's build_args, then our image sync."""
    # quoted: the user pastes this line into a shell, and the words are the recipe author's
    build = shlex.join(["./build-and-copy.sh", "-t", image, *recipe.build_args])
    return (f"build it on the head with eugr's spark-vllm-docker: `{build}`; then "
            f"`{shlex.join(['sparkcluster', 'image', 'sync', image])}` puts it on every node "
            "(or name another image with --image)")
