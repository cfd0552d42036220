"""llama-benchy's receipt: its parameters and its prompt set (the corpus as its tokenizer cut it), from what the
target and the session already hold."""

from __future__ import annotations

import hashlib
from array import array
from typing import Any

from ...receipt import BenchParams, Receipt
from ...receipt_metrics import Snapshot, between
from ...receipt_sources import assemble
from ...receipts import endpoint_version
from ...target import Target
from .corpus import Corpus

ARENA_RECEIPT = "receipt.json"  # in a profile's --out DIR, beside the Arena's own four files (whose format it keeps)


def corpus_digest(corpus: Corpus) -> str:
    """llama-benchy's prompt set: slices of one corpus as its tokenizer cuts it, so the tokens themselves name it."""
    digest = hashlib.sha256(f"{corpus.tokenizer.name}\n".encode())
    digest.update(array("q", corpus.tokens).tobytes())
    return digest.hexdigest()


def benchy_receipt(target: Target, parameters: dict[str, Any], corpus: Corpus | None, before: Snapshot | None,
                   after: Snapshot | None) -> Receipt:
    """`parameters`: llama-benchy's own, as its document records them; the engine's /metrics from after the session's
    warm-up to the last cell (each cell's own warm-up run, part of llama-benchy's method, included)."""
    params = BenchParams("llama-benchy", parameters, corpus_digest(corpus) if corpus else None)
    version = None if target.served and target.served.vllm_build else endpoint_version(target.base_url, target.api_key)
    return assemble(target.base_url, target.served, version, params, between(before, after))
