"""Serving recipes: named YAML files of vLLM flags and environment (seed-recipes.md), overridable flag by flag
with the extra arguments after `--`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..engine.errors import UsageError, did_you_mean
from ..engine import yamlsource

BUNDLED = resources.files("sparkcluster") / "recipes"
KEYS = {"description", "model", "served_model_name", "port", "env", "flags"}
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


def bundled_names() -> list[str]:
    return sorted(p.name[:-4] for p in BUNDLED.iterdir() if p.name.endswith(".yml"))


def load_recipe(name_or_path: str) -> Recipe:
    """A bundled recipe by name, or a recipe file by path; every error names the fix."""
    path = Path(name_or_path)
    if name_or_path.endswith((".yml", ".yaml")) or path.is_file():
        if not path.is_file():
            raise UsageError(f"recipe file {name_or_path} does not exist", "give a bundled name or an existing file")
        text, shown, name = path.read_text(), name_or_path, path.stem
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


def _recipe(name: str, shown: str, doc: object) -> Recipe:
    if not isinstance(doc, dict):
        raise UsageError(f"{shown}: a recipe is a mapping of {', '.join(sorted(KEYS))}", "see recipes/default.yml")
    unknown = sorted(set(doc) - KEYS)
    if unknown:
        raise UsageError(f"{shown}: unknown key {unknown[0]!r}{did_you_mean(str(unknown[0]), sorted(KEYS))}",
                         f"recipe keys: {', '.join(sorted(KEYS))}")
    flags: dict[str, str | None] = {}
    for flag, value in (doc.get("flags") or {}).items():
        flag = str(flag)
        if not flag.startswith("-"):
            raise UsageError(f"{shown}: flag {flag!r} must start with --", f"write it as --{flag}")
        if flag in OWNED_FLAGS:
            raise UsageError(f"{shown}: {flag} is set by sparkcluster", f"use sparkcluster's {OWNED_FLAGS[flag]}")
        if value is False:
            continue
        flags[flag] = None if value is True else str(value)
    env = {str(k): str(v) for k, v in (doc.get("env") or {}).items()}
    port = doc.get("port")
    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise UsageError(f"{shown}: port {port!r} is not a TCP port", "give a number between 1 and 65535")
    return Recipe(name, str(doc.get("description", "")), _opt_str(doc.get("model")),
                  _opt_str(doc.get("served_model_name")), port, env, flags)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


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
