"""How big a recipe may get: its file, and what its template renders to, bounded before anything is rendered.

A recipe is a page of YAML (the community's largest is a few KB) that becomes one command line. Without a bound, an
untrusted recipe could keep `recipes show` busy for minutes and gigabytes (round 5, H1): YAML aliases expanded by
the include merge and by rendering (refused in yamlfile.py), or, with no alias at all, `{placeholders}` that
repeat each other across sparkrun's rounds of substitution inside `defaults` (five rounds of a value holding a
thousand `{next}` make 10^15 bytes). So each value's and the command's rendered length are computed first, as
numbers, by the same substitution (every `{name}` counted, an upper bound), and a recipe past the bound is refused
at the line of the value that grows. The merged document of an include chain is bounded by the file bound times
the chain's depth (at most 5 files, load.py), since aliases are refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..engine.errors import UsageError
from . import values as recipe_values
from .types import Inputs

MAX_RECIPE_BYTES = 256 * 1024
MAX_RENDERED_BYTES = 256 * 1024
ROUNDS = 5  # sparkrun's rounds of substitution inside defaults (community.py)
_NAME = re.compile(r"\{([A-Za-z_]\w*)\}")  # every {name}, doubled braces included: an upper bound
_FIX = "a recipe's values are a few words each: write the value out instead of repeating placeholders"


def check_file_size(size: int, shown: str) -> None:
    if size > MAX_RECIPE_BYTES:
        raise UsageError(f"{shown}: the recipe is more than {MAX_RECIPE_BYTES // 1024} KiB",
                         "a recipe is a page of YAML: keep model files, templates and scripts in a mod")


def check_render_sizes(doc: Any, inputs: Inputs, shown: str) -> None:
    """Refuses a community recipe whose defaults or command would render past MAX_RENDERED_BYTES."""
    if not isinstance(doc, Mapping):
        return
    layers = [doc.get("defaults"), *(layer.get("defaults") for layer in _overrides(doc))]
    texts: dict[str, str] = {}
    lines: dict[str, int] = {}
    for layer in layers:
        if not isinstance(layer, Mapping):
            continue
        for key, value in layer.items():
            text = str(value)
            if len(text) >= len(texts.get(str(key), "")):  # the longest of a key's layers bounds them all
                texts[str(key)], lines[str(key)] = text, recipe_values.key_line(layer, key)
    for key, value in (("model", str(doc.get("model") or "")), *inputs.options.items(), *inputs.sets.items()):
        texts[key], lines[key] = value, lines.get(key, recipe_values.key_line(doc, "defaults"))
    sizes = {key: len(text) for key, text in texts.items()}
    refs = {key: _NAME.findall(text) for key, text in texts.items()}
    for _ in range(ROUNDS):
        for key in sizes:  # in place, in order, as the substitution itself runs
            if refs[key]:
                sizes[key] = len(_NAME.sub("", texts[key])) + sum(sizes.get(r, len(r) + 2) for r in refs[key])
                if sizes[key] > MAX_RENDERED_BYTES:
                    raise UsageError(f"{shown}:{lines[key]}: {key} renders to more than "
                                     f"{MAX_RENDERED_BYTES // 1024} KiB (its placeholders repeat each other)", _FIX)
    command = doc.get("command")
    if isinstance(command, str):
        where = f"{shown}:{recipe_values.key_line(doc, 'command')}"
        rendered = len(command) + sum(sizes.get(n, 0) for n in _NAME.findall(command))
        if rendered > MAX_RENDERED_BYTES:
            raise UsageError(f"{where}: the command renders to more than {MAX_RENDERED_BYTES // 1024} KiB", _FIX)


def _overrides(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    layers = doc.get("overrides")
    return [layer for layer in layers if isinstance(layer, Mapping)] if isinstance(layers, list) else []
