"""The receipt of each method's result, from what the target, the sweep and the endpoint already hold."""

from __future__ import annotations

import hashlib
from typing import Any

from . import prompts
from .receipt import BenchParams, Receipt
from .receipt_metrics import between
from .receipt_sources import assemble
from .sweep import Prepared
from .target import Target


def prompt_set_digest(words: int, shared: bool) -> str:
    """The sustained method's prompt set: every prompt is drawn by prompts.py's generator at `words` words, one seed
    per request (or the one shared seed with --prefix-cache), so the generator's first prompt at that length, with
    which of the two it was, names the set; the per-run seeds only keep the cache from finding a second bench's."""
    head = f"sparkcluster prompts: {words} words, {'one shared prompt' if shared else 'a seed per request'}\n"
    return hashlib.sha256((head + prompts.prompt(words, prompts.SHARED_SEED)).encode()).hexdigest()


def sweep_receipt(target: Target, prepared: Prepared, method: dict[str, Any]) -> Receipt:
    """`method`: the sustained method's parameters as the result's config records them."""
    params = BenchParams("sustained", method, prompt_set_digest(prepared.prompt_words, bool(method.get("prefix_cache")))
                         if prepared.prompt_words else None)
    return assemble(target.base_url, target.served, prepared.server_version, params,
                    between(prepared.metrics_before, prepared.metrics_after))
