"""A staged model's config.json, read from a node's HF cache, and what a decode step all-reduces.

One reader for everything that sizes a model before or while it is served: serving's fit check (its weights
against a replica's memory), bench's decode ceiling and decode budget, and `verify --tune`, which times NCCL's
settings at the decode sizes (hidden size x concurrency x activation bytes) of the model it is told about. It sits
in node, below all of them: a model's files are what a node's HF cache holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engine.command import Command
from ..engine.errors import UsageError
from ..engine.remote import HF_HOME
from ..engine.session import Session

MAX_CONFIG_BYTES = 1 << 20
INDEX_SEPARATOR = "@@index@@"
# Megatron-LM's tensor parallelism as vLLM lays it out (bench/decode_budget.py says where): one all-reduce after
# attention and one after the MLP (or the MoE experts) per layer, plus the vocabulary-parallel embedding's.
ALL_REDUCES_PER_LAYER = 2
# Quantised weights still all-reduce 16-bit values, and vLLM's dtype "auto" serves a float32 checkpoint in 16 bits.
ACTIVATION_BYTES = {"float32": 2, "float16": 2, "bfloat16": 2}


def snapshot_line(model: str) -> str:
    """Shell that sets `d` to the model's snapshot in the node's HF cache (refs/main's, else any holding a
    config.json), or exits 3 where the node has none."""
    repo = f'"{HF_HOME}/hub/models--{model.replace("/", "--")}"'
    return (f'repo={repo}; ref=$(cat "$repo/refs/main" 2>/dev/null); d="$repo/snapshots/$ref"; '
            f'[ -n "$ref" ] && [ -f "$d/config.json" ] || d=$(dirname "$(ls "$repo"/snapshots/*/config.json '
            f'2>/dev/null | head -n 1)" 2>/dev/null); [ -f "$d/config.json" ] || exit 3; ')


def is_repo_id(model: str) -> bool:
    """ORG/NAME (or a bare NAME) with nothing a shell or a path could read otherwise: what the HF cache is keyed by;
    a path on the nodes is not."""
    return bool(model) and not model.startswith(("/", ".", "~")) and ".." not in model \
        and not any(ch in model for ch in "\"'`$\\ \n")


def config_script(model: str) -> str:
    """Prints the snapshot's config.json, a separator, then its model.safetensors.index.json (if any)."""
    return (f'{snapshot_line(model)}head -c {MAX_CONFIG_BYTES} "$d/config.json"; echo; echo {INDEX_SEPARATOR}; '
            f'head -c {MAX_CONFIG_BYTES} "$d/model.safetensors.index.json" 2>/dev/null; true')


def read_staged(session: Session, model: str) -> tuple[dict[str, Any], int | None] | None:
    """(config.json, the safetensors index's total size) of the model staged on the head; None where it has none
    (or `model` is no repo id)."""
    if not is_repo_id(model):
        return None
    result = session.run(session.head, Command(config_script(model), timeout=60))
    if not result.ok:
        return None
    config_text, _, index_text = result.stdout.partition(INDEX_SEPARATOR)
    try:
        config = json.loads(config_text)
    except ValueError:
        return None
    total = None
    try:
        total = json.loads(index_text).get("metadata", {}).get("total_size")
    except (ValueError, AttributeError):
        pass
    return (config, total if isinstance(total, int) else None) if isinstance(config, dict) else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A multimodal model keeps its language model's settings under text_config."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, Mapping) else config


def config_int(config: Mapping[str, Any], *names: str, default: int = 0) -> int:
    """The first of `names` that config.json sets to a whole number (models name the same thing differently)."""
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


@dataclass(frozen=True)
class StepShape:
    """What a decode step all-reduces, from the model's config.json."""

    layers: int
    hidden: int
    activation_bytes: int

    @property
    def all_reduces(self) -> int:
        return ALL_REDUCES_PER_LAYER * self.layers + 1  # + the vocabulary-parallel embedding's

    def message_bytes(self, concurrency: int) -> int:
        """One all-reduce at `concurrency`: every running sequence adds one token's hidden state."""
        return concurrency * self.hidden * self.activation_bytes


def step_shape(config: Mapping[str, Any]) -> StepShape:
    c = text_config(config)
    layers = config_int(c, "num_hidden_layers", "n_layer", "num_layers")
    hidden = config_int(c, "hidden_size", "d_model", "n_embd")
    if not (layers and hidden):
        raise ValueError("config.json names no num_hidden_layers and hidden_size")
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    return StepShape(layers, hidden, ACTIVATION_BYTES.get(dtype, 2))


def staged_shape(session: Session, model: str) -> StepShape:
    """The decode step of `model` as staged on the head; a UsageError naming the fix where it is not there."""
    found = read_staged(session, model)
    if found is None:
        raise UsageError(f"{session.head.name} has no config.json of {model} in its HF cache",
                         f"stage it first (`sparkcluster stage {model}`), or give its hidden size (--hidden-size)")
    try:
        return step_shape(found[0])
    except ValueError as e:
        raise UsageError(f"{model}'s config.json: {e}", "give its hidden size (--hidden-size)") from None
