"""A community recipe's `command:` as eugr's and sparkrun's launchers turn it into a process: a template filled by
the rule of the tool whose format it is (eugr's `str.format`, sparkrun's `{name}` substitution), backslash line
continuations joined, then read back as words into the model and vLLM's flags, so that sparkcluster launches it
with its own parallelism, ports and multi-node flags."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..engine.errors import UsageError

FlagValue = str | None | tuple[str, ...]  # None: a bare flag; a tuple: a flag taking several words
# The flags a launcher sets itself, by every spelling vLLM accepts, under one canonical name.
TAKEN_OVER = {
    "-tp": "--tensor-parallel-size", "--tensor-parallel-size": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size", "--pipeline-parallel-size": "--pipeline-parallel-size",
    "--port": "--port", "--host": "--host", "--served-model-name": "--served-model-name",
    "--distributed-executor-backend": "--distributed-executor-backend",
    "--nnodes": "--nnodes", "--node-rank": "--node-rank",
    "--master-addr": "--master-addr", "--master-port": "--master-port", "--headless": "--headless",
}
_PLACEHOLDER_FIX = "placeholders are {name}; write a literal brace twice, e.g. '{{\"method\": \"mtp\"}}'"
# Whose rule fills a template: eugr's run-recipe (v1) or sparkrun (v2).
TemplateRule = Literal["eugr", "sparkrun"]
# A template's braces as both tools scan them, left to right: an escape (`{{`, `}}`), a `{...}` span holding no
# brace (a placeholder, or plain JSON such as `{"reasoning_parser": "x"}`), or a lone brace.
_BRACES = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A span that reads as a placeholder gone wrong rather than as text: `{a.b}`, `{max-len}`, `{x!r}`, `{0}`.
_NAME_LIKE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.!:\[\]-]*")
# bash continues a line only at a backslash right before the newline; blanks after it (invisible in a recipe) make
# it an escaped blank, a stray argument, and sparkrun strips them, as here.
_CONTINUATION = re.compile(r"\\[ \t]*\r?\n")


def canonical(flag: str) -> str:
    """vLLM reads `--max_model_len` as `--max-model-len`; `-tp` is `--tensor-parallel-size`."""
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")
    return TAKEN_OVER.get(flag, flag)


def render(template: str, values: Mapping[str, object], where: str, rule: TemplateRule) -> str:
    """The template filled in, by the rule of the tool whose format it is.

    eugr (v1) fills it with Python's `str.format`: `{{` and `}}` are literal braces and every other brace belongs
    to a placeholder. sparkrun (v2) replaces only `{name}`: any other brace is text as written (`--reasoning-config
    '{"reasoning_parser": "x"}'`), and `{{`/`}}` are escapes for one brace only in a template that uses them (a v1
    command pasted into a v2 recipe). eugr stops at an unfilled placeholder and sparkrun leaves it for vLLM to
    choke on; here it is refused, naming the `--set` that fills it."""
    escapes = rule == "eugr" or "{{" in template

    def fill(token: re.Match[str]) -> str:
        text, name = token.group(0), token.group(1)
        if text in ("{{", "}}"):
            return text[0] if escapes else text
        if name is not None and _NAME.fullmatch(name):
            if name not in values:
                raise UsageError(f"{where}: the command needs a value for {{{name}}}, and the recipe's defaults give "
                                 "none",
                                 f"give it with --set {name}=VALUE, or add `{name}:` under the recipe's defaults")
            return str(values[name])  # a YAML true reaches vLLM as True, as in eugr's launcher
        if name is None and rule == "eugr":
            raise UsageError(f"{where}: the command template cannot be read: a single {text!r}", _PLACEHOLDER_FIX)
        if name is not None and (rule == "eugr" or _NAME_LIKE.fullmatch(name)):
            raise UsageError(f"{where}: the command template has the placeholder {text}, not a plain name",
                             _PLACEHOLDER_FIX)
        return text

    return _BRACES.sub(fill, template)


@dataclass(frozen=True)
class VllmLine:
    """A rendered `vllm serve` line read back: the model, the flags sparkcluster takes over and the rest."""

    model: str
    taken: Mapping[str, FlagValue]  # canonical name -> value
    flags: Mapping[str, FlagValue]  # in order, as written (the last of a repeated flag wins, as in vLLM)
    env: Mapping[str, str]  # `NAME=value` words before `vllm` (rare, but valid shell)


def split_words(command: str, where: str) -> list[str]:
    joined = _CONTINUATION.sub(" ", command)  # backslash continuations, as bash joins them
    try:
        return shlex.split(joined, comments=True)
    except ValueError as e:
        raise UsageError(f"{where}: the command is not valid shell words: {e}", "close the quote it opens") from None


def parse_vllm_line(command: str, where: str) -> VllmLine:
    words = split_words(command, where)
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        env_name, env_value = words.pop(0).split("=", 1)
        env[env_name] = env_value
    if words[:1] == ["exec"]:
        words.pop(0)
    if words[:2] != ["vllm", "serve"] or len(words) < 3 or words[2].startswith("-"):
        shown = " ".join(words[:3]) or "(nothing)"
        raise UsageError(f"{where}: the command must start `vllm serve MODEL`, not {shown!r}",
                         "sparkcluster serves vLLM recipes only; write the command as `vllm serve ORG/NAME --flag ...`")
    if any(w in {"&&", "||", ";", "|", "&"} for w in words):
        raise UsageError(f"{where}: the command runs more than `vllm serve` (a shell operator)",
                         "move the other commands into a mod (a directory with run.sh) the recipe names under mods:")
    taken: dict[str, FlagValue] = {}
    flags: dict[str, FlagValue] = {}
    for flag, given in flag_words(words[3:], where).items():
        name = canonical(flag)
        if name in TAKEN_OVER.values():
            taken[name] = given
        else:
            flags.pop(flag, None)
            flags[flag] = given
    return VllmLine(words[2], taken, flags, env)


def flag_words(words: list[str], where: str) -> dict[str, FlagValue]:
    """`--x 1`, `--x=1`, `--flag`, `--x a b` (several words) as flag -> value."""
    flags: dict[str, FlagValue] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or _is_number(word):
            raise UsageError(f"{where}: {word!r} follows no flag", "every word after the model belongs to a --flag")
        if word.startswith("--") and "=" in word:
            key, value = word.split("=", 1)
            flags.pop(key, None)
            flags[key] = value
            i += 1
            continue
        values = []
        i += 1
        while i < len(words) and (not words[i].startswith("-") or _is_number(words[i])):
            values.append(words[i])
            i += 1
        flags.pop(word, None)
        flags[word] = None if not values else values[0] if len(values) == 1 else tuple(values)
    return flags


def _is_number(word: str) -> bool:
    return re.fullmatch(r"-\d+(\.\d+)?", word) is not None


def flag_argv(flags: Mapping[str, FlagValue]) -> tuple[str, ...]:
    words: list[str] = []
    for flag, value in flags.items():
        words.append(flag)
        if isinstance(value, tuple):
            words.extend(value)
        elif value is not None:
            words.append(value)
    return tuple(words)


def as_int(value: FlagValue, flag: str, where: str) -> int:
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    raise UsageError(f"{where}: {flag} {value!r} is not a positive whole number", f"write e.g. `{flag} 2`")
