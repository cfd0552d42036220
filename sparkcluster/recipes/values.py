"""The values of a recipe file, checked as inventories are: each problem at its `file:line`, with the fix, before
anything connects.

A recipe's env becomes `export NAME=value` on every node and its flags become vLLM's argv, so a name the shell
would not read as a name, or a list where one word is meant, is refused here rather than reaching a node.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from ..engine.command import ENV_NAME
from ..engine.errors import UsageError, did_you_mean
from ..engine.yamlsource import SourceList, SourceMap, describe

# vLLM's flags: `--max-num-seqs`, `-O`, `--compilation-config.level`; never a space or a shell character.
FLAG_NAME = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_.-]*")
_SCALAR = (str, int, float)


def error(shown: str, line: int, problem: str, fix: str) -> UsageError:
    return UsageError(f"{shown}:{line}: {problem}", fix)


def key_line(doc: Any, key: Any) -> int:
    """The line `key` is written on; 1 for a document without lines (an empty file)."""
    return doc.key_line(key) if isinstance(doc, SourceMap) and key in doc else 1


def top_level(doc: Any, shown: str, keys: Collection[str], formats: str = "") -> dict[str, Any]:
    if not isinstance(doc, dict):
        line = doc.line if isinstance(doc, SourceList) else 1
        raise error(shown, line, f"a recipe is a mapping of {', '.join(sorted(keys))}, not {describe(doc)}",
                    "see recipes/default.yml" + (f"; {formats}" if formats else ""))
    for key in doc:
        if key not in keys:
            raise error(shown, key_line(doc, key), f"unknown key {key!r}{did_you_mean(key, sorted(keys))}",
                        f"recipe keys: {', '.join(sorted(keys))}" + (f"; {formats}" if formats else ""))
    return doc


def text(doc: dict[str, Any], key: str, shown: str) -> str | None:
    """An optional one-line value (description, model, served_model_name)."""
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, _SCALAR):
        raise error(shown, key_line(doc, key), f"{key} must be text, not {describe(value)}", f"e.g. `{key}: some-text`")
    return str(value)


def port(doc: dict[str, Any], shown: str) -> int | None:
    value = doc.get("port")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise error(shown, key_line(doc, "port"), f"port {describe(value)} is not a TCP port",
                    "give a number between 1 and 65535")
    return value


def replicas(doc: dict[str, Any], shown: str) -> int | None:
    """Engines behind vLLM's router (serve --replicas), a whole number of at least 1."""
    value = doc.get("replicas")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(shown, key_line(doc, "replicas"), f"replicas {describe(value)} is not a number of engines",
                    "give a whole number of at least 1 (e.g. `replicas: 2`), which divides the nodes")
    return value


def env(doc: dict[str, Any], shown: str) -> dict[str, str]:
    values = _mapping(doc, "env", shown, "`env:` followed by indented `NAME: value` lines, e.g. `VLLM_LOGGING_LEVEL: INFO`")
    result: dict[str, str] = {}
    for name, value in values.items():
        line = key_line(values, name)
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise error(shown, line, f"env: {describe(name)} is not an environment variable name",
                        "use letters, digits and '_', not starting with a digit, e.g. VLLM_LOGGING_LEVEL")
        result[name] = _one_value(value, f"env: {name}", shown, line)
    return result


def flags(doc: dict[str, Any], shown: str, owned: dict[str, str]) -> dict[str, str | None]:
    """Flag -> value, None for a bare flag (`true`); `false` leaves a flag out."""
    values = _mapping(doc, "flags", shown, "`flags:` followed by indented `--flag: value` lines, e.g. `--max-num-seqs: 64`")
    result: dict[str, str | None] = {}
    for flag, value in values.items():
        line = key_line(values, flag)
        if not isinstance(flag, str) or not flag.startswith("-"):
            raise error(shown, line, f"flag {describe(flag)} must start with --", f"write it as --{flag}")
        if not FLAG_NAME.fullmatch(flag):
            raise error(shown, line, f"{flag!r} is not a flag name",
                        "vLLM's flags are letters, digits and '-', e.g. --max-num-seqs")
        if flag in owned:
            raise error(shown, line, f"{flag} is set by sparkcluster", f"use sparkcluster's {owned[flag]}")
        if value is False:
            continue
        result[flag] = None if value is True else _one_value(value, f"flag {flag}", shown, line)
    return result


def _mapping(doc: dict[str, Any], key: str, shown: str, example: str) -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise error(shown, key_line(doc, key), f"{key} must map names to values, not {describe(value)}", f"write {example}")
    return value


def _one_value(value: Any, what: str, shown: str, line: int) -> str:
    if isinstance(value, _SCALAR):  # bool is an int: `true` stays the word True, as YAML wrote it
        return str(value)
    raise error(shown, line, f"{what} must be one value, not {describe(value)}",
                "write one word or number; quote JSON as a string, e.g. '{\"level\": 3}'; for an empty value write ''")


