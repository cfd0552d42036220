"""Does the model fit a replica? Its weights (the safetensors index's total_size, as bench's ceiling reads it, else
the snapshot's safetensors files summed) against the unified memory of a replica's nodes times the share vLLM
may use (--gpu-memory-utilization, 0.9 by default). Checked on the head's snapshot once it is staged, before any
Ray or vLLM starts: two replicas of a 120B bf16 model (240 GB) on one Spark each cannot load, and vLLM would only
say so minutes later. Unknown sizes (a path, no safetensors) are not guessed: vLLM's own check stands."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..engine.command import Command
from ..engine.errors import UsageError
from ..engine.session import Session
from ..node.modelconfig import is_repo_id, snapshot_line
from ..recipes.command import flag_words
from .layout import Layout

NODE_MEMORY_BYTES = 128e9  # a GB10's unified LPDDR5x (reference/spark-captures.md)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share
MAX_INDEX_BYTES = 1 << 20
SEPARATOR = "@@files@@"


def weights_script(model: str) -> str:
    """Prints the head snapshot's safetensors index, a separator, then the bytes of its safetensors files."""
    return (f'{snapshot_line(model)}head -c {MAX_INDEX_BYTES} "$d/model.safetensors.index.json" 2>/dev/null; '
            f'echo; echo {SEPARATOR}; du -cbL "$d"/*.safetensors 2>/dev/null | tail -n 1 | cut -f1; true')


def parse_weights(text: str) -> int | None:
    """The weights' bytes from weights_script's output; None where neither the index nor files tell."""
    index_text, _, files_text = text.partition(SEPARATOR)
    try:
        total = json.loads(index_text).get("metadata", {}).get("total_size")
        if isinstance(total, int) and total > 0:
            return total
    except (ValueError, AttributeError):
        pass
    files = files_text.strip()
    return int(files) if files.isdigit() and int(files) > 0 else None


def gpu_memory_utilization(flags: Sequence[str]) -> float:
    value = flag_words(list(flags), "the vLLM flags").get("--gpu-memory-utilization")
    try:
        return float(value) if isinstance(value, str) else DEFAULT_GPU_MEMORY_UTILIZATION
    except ValueError:
        return DEFAULT_GPU_MEMORY_UTILIZATION


def check_fit(model: str, weights: int | None, layout: Layout, flags: Sequence[str]) -> None:
    """Refused (exit 2) where the weights alone exceed what a replica's nodes give vLLM."""
    if weights is None:
        return
    share = gpu_memory_utilization(flags)
    per = layout.nodes_per_replica
    room = per * NODE_MEMORY_BYTES * share
    if weights <= room:
        return
    need = -(-weights // int(NODE_MEMORY_BYTES * share))  # nodes whose memory holds the weights, rounded up
    raise UsageError(f"{model}'s weights are {weights / 1e9:,.1f} GB, and a replica of {layout.describe()} has "
                     f"{per} node(s): {room / 1e9:,.1f} GB for vLLM ({NODE_MEMORY_BYTES / 1e9:.0f} GB x "
                     f"gpu-memory-utilization {share:g})",
                     f"give each replica at least {need} nodes (fewer --replicas, or --replicas 1), or serve a "
                     "smaller or quantized model")


def replica_fit(session: Session, model: str, layout: Layout, flags: Sequence[str]) -> None:
    """check_fit on the head's snapshot of `model` (a repo id; a path on the nodes is not read), for replicas: each
    must hold the whole model. One engine across the nodes is left to vLLM's own check."""
    if not layout.routed:
        return
    if not is_repo_id(model):
        return
    result = session.run(session.head, Command(weights_script(model), timeout=60))
    check_fit(model, parse_weights(result.stdout) if result.ok else None, layout, flags)
