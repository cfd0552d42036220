"""verify --tune's decode shape: the hidden size and activation bytes of the model served, from its config.json
(the snapshot staged on the head, as bench's ceiling and decode budget read it), where --hidden-size does not give
them. The flags win; which was used is said beside the figures."""

from __future__ import annotations

from dataclasses import dataclass

from ..bench.ceiling import read_from_head
from ..bench.decode_budget import step_shape
from ..engine.errors import SparkclusterError
from ..engine.session import Session
from ..serving.record import read_record

DEFAULT_DTYPE_BYTES = 2  # bf16, where neither the flag nor a config says


@dataclass(frozen=True)
class DecodeShape:
    hidden_size: int
    dtype_bytes: int
    source: str  # said beside the figures: which flag or which model's config.json


def decode_shape(session: Session, hidden_size: int | None, dtype_bytes: int | None,
                 model: str | None = None) -> DecodeShape:
    """--hidden-size (and --dtype-bytes) where given; else `model`'s config.json on the head (--model), else the
    serve record's model's. An error naming the fix where none of them tells."""
    if hidden_size is not None:
        return DecodeShape(hidden_size, dtype_bytes or DEFAULT_DTYPE_BYTES, "--hidden-size")
    why = "--model" if model else "the model served, by the head's serve record"
    if model is None:
        record = read_record(session)
        model = record.serving.model if record is not None and record.serving is not None else None
    if model is None:
        raise SparkclusterError("verify --tune needs the served model's hidden size: no --hidden-size, no --model, "
                                "and nothing is served (no serve record on the head)",
                                "pass --hidden-size (config.json's hidden_size, e.g. 4096 for Llama-3-8B) or "
                                "--model ORG/NAME (a model staged on the head)")
    found = read_from_head(session, model)
    try:
        shape = step_shape(found[0]) if found is not None else None
    except ValueError:
        shape = None
    if shape is None:
        raise SparkclusterError(f"verify --tune: no config.json with a hidden size for {model} ({why}) staged on "
                                f"{session.head.name}", "stage it (`sparkcluster stage`), or pass --hidden-size")
    bytes_from = "--dtype-bytes" if dtype_bytes else "its dtype"
    return DecodeShape(shape.hidden, dtype_bytes or shape.activation_bytes,
                       f"{model}'s config.json on {session.head.name} ({why}; dtype bytes: {bytes_from})")
