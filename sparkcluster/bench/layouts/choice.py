"""Which layouts `bench --layouts` serves on the selected nodes: each kind named (tp, pp, replicas) as the layout
it means there (serving/layout.py). Each is then checked as `serve` checks it (bench/layouts/cli.py), and a refusal
names the layout and how to leave it out, before anything connects (exit 2). The best one is then given as the
`serve` line that serves it as it was measured (`serve_line`)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ...engine.errors import UsageError
from ...engine.secret_names import is_secret_name
from ...serving.layout import LAYOUT_KINDS, Layout, LayoutKind

EXAMPLE = "e.g. --layouts tp,replicas"


def parse_kinds(values: list[str]) -> tuple[LayoutKind, ...]:
    """`--layouts tp,pp replicas`: each kind once, in the order given."""
    words = [w.strip() for text in values for w in text.split(",") if w.strip()]
    unknown = [w for w in words if w not in LAYOUT_KINDS]
    if unknown or not words:
        raise UsageError(f"--layouts {' '.join(values)}: {', '.join(map(repr, unknown)) or 'no layout'} is not one "
                         f"of {', '.join(LAYOUT_KINDS)}", EXAMPLE)
    return tuple(dict.fromkeys(k for w in words for k in LAYOUT_KINDS if k == w))


def layouts_for(kinds: tuple[LayoutKind, ...], count: int) -> tuple[Layout, ...]:
    """The layout each kind means on `count` nodes; on one node every kind is the same single engine."""
    if count == 1 and kinds != ("tp",):
        others = ", ".join(k for k in kinds if k != "tp")
        raise UsageError(f"--layouts {','.join(kinds)} on 1 node: {others} needs 2 nodes or more (on one node every "
                         "layout is the same single engine)", "select 2 or more nodes (inventory or --limit)")
    return tuple(Layout.of_kind(kind, count) for kind in kinds)


@contextmanager
def refused_as(kind: LayoutKind, layout: Layout) -> Iterator[None]:
    """A refusal of serve's, for one layout of several: named by its kind, with how to measure the others."""
    try:
        yield
    except UsageError as e:
        raise UsageError(f"--layouts {kind} ({layout.describe()}): {e.message}",
                         f"{e.fix}; or measure the other layouts (leave {kind} out of --layouts)") from None


def serve_line(layout: Layout, serve_flags: Sequence[str], vllm_flags: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """The `sparkcluster serve` command that serves `layout` as it was measured, to paste: its TP, PP and replicas
    all three said (a recipe's or the inventory's own would otherwise win), `serve_flags` (the inventory, model,
    recipe, runtime ... bench was given) and the vLLM flags after `--`. A secret's value (`--api-key KEY`, `--set
    hf_token=T`: engine/secret_names.py's rule) is never printed: the line reads it from a shell variable instead.
    Returns the line and the variables it reads, for the user to set."""
    words = ["sparkcluster", "serve", "--tp", str(layout.tp), "--pp", str(layout.pp), "--replicas",
             str(layout.replicas), *serve_flags]
    line, needed = _pasteable(words)
    if vllm_flags:
        extra, more = _pasteable(["--", *vllm_flags])
        line, needed = f"{line} {extra}", (*needed, *(v for v in more if v not in needed))
    return line, needed


def _pasteable(words: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Words quoted for a POSIX shell, a secret's value replaced by a reference to a variable named after it."""
    out: list[str] = []
    needed: dict[str, None] = {}
    secret_next: str | None = None
    for word in words:
        if secret_next is not None and not word.startswith("-"):
            out.append(f'"${secret_next}"')
            needed[secret_next] = None
            secret_next = None
            continue
        secret_next = None
        name, eq, _ = word.lstrip("-").partition("=")
        if not is_secret_name(name):
            out.append(shlex.quote(word))
        elif eq:  # --api-key=KEY, or a --set's api_key=KEY
            variable = _variable(name)
            out.append(f'{shlex.quote(word.partition("=")[0] + "=")}"${variable}"')
            needed[variable] = None
        else:
            out.append(shlex.quote(word))
            secret_next = _variable(name) if word.startswith("--") else None
    return " ".join(out), tuple(needed)


def _variable(name: str) -> str:
    """api-key -> API_KEY: a shell variable's name for a secret flag or placeholder."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name).upper()
