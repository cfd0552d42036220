"""verify --tune's block in the comm env, as text: the NCCL variables verify chose by measurement (sparkcluster/nccl/
tune.py chooses and writes them), between two marker lines, after what bootstrap wrote. Here, below both, so that
bootstrap's comm.env step keeps the block when it rewrites the file, and verify and bench read it."""

from __future__ import annotations

import re

BLOCK_BEGIN = "# >>> sparkcluster verify --tune (sparkcluster verify --tune --reset removes it)"
BLOCK_END = "# <<< sparkcluster verify --tune"


def without_tuning(text: str) -> str:
    """The comm env with verify --tune's block removed (and nothing else)."""
    lines, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == BLOCK_BEGIN:
            inside = True
        elif inside and line.rstrip("\n") == BLOCK_END:
            inside = False
        elif not inside:
            lines.append(line)
    return "".join(lines)


def keep_tuning(old: str, new: str) -> str:
    """`new` (bootstrap's rewrite of the comm env) with `old`'s verify --tune block carried over: its values were
    chosen by measurement on this cluster, and a re-run of bootstrap must not drop them unsaid. A variable `new`
    itself sets is left out of the block (bootstrap's value is a requirement, e.g. a ring's NCCL_ALGO=Ring); a block
    left with no variable is dropped."""
    base = without_tuning(new)
    owned = {line.partition("=")[0] for line in base.splitlines() if "=" in line and not line.startswith("#")}
    block, inside = [], False
    for line in old.splitlines():
        if line == BLOCK_BEGIN:
            inside = True
        elif line == BLOCK_END:
            inside = False
        elif inside and (line.startswith("#") or "=" in line and line.partition("=")[0] not in owned):
            block.append(line)
    if not any(not line.startswith("#") for line in block):
        return base
    lines = [BLOCK_BEGIN, *block, BLOCK_END]
    return base + ("" if not base or base.endswith("\n") else "\n") + "\n".join(lines) + "\n"


def tuned_settings(text: str) -> dict[str, str]:
    """The variables in verify --tune's block (bench's receipts and the decode budget name them); {} for none."""
    found, inside = {}, False
    for line in text.splitlines():
        if line == BLOCK_BEGIN:
            inside = True
        elif line == BLOCK_END:
            inside = False
        elif inside and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", key):  # a variable name, safe in a shell's `unset`
                found[key] = value
    return found
