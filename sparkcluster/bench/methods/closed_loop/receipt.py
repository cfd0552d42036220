"""The closed loop's receipt: its parameters as measured and its prompt set, from what the target and the sweep
already hold."""

from __future__ import annotations

import hashlib
from typing import Any

from ...receipt import BenchParams, Receipt
from ...receipt_metrics import between
from ...receipt_sources import assemble
from ...target import Target
from . import prompts
from .sweep import Prepared, SweepOptions


def prompt_set_digest(words: int, shared: bool) -> str:
    """The sustained method's prompt set: every prompt is drawn by prompts.py's generator at `words` words, one seed
    per request (or the one shared seed with --prefix-cache), so the generator's first prompt at that length, with
    which of the two it was, names the set; the per-run seeds only keep the cache from finding a second bench's."""
    head = f"sparkcluster prompts: {words} words, {'one shared prompt' if shared else 'a seed per request'}\n"
    return hashlib.sha256((head + prompts.prompt(words, prompts.SHARED_SEED)).encode()).hexdigest()


def sustained_parameters(opts: SweepOptions, prepared: Prepared) -> dict[str, Any]:
    """The sustained method's parameters as measured (`opts`: the sizes fitted to the served context), as a
    result's config and its receipt record them."""
    return {
        "api": "/v1/completions, streamed", "concurrency": list(opts.concurrency),
        "prompt_tokens": opts.prompt_tokens, "prompt_tokens_measured": prepared.prompt_tokens or None,
        "output_tokens": opts.output_tokens, "max_model_len": prepared.max_model_len,
        "runs": opts.runs, "warmup": opts.warmup,
        "requests_per_stream": opts.requests_per_stream, "prefix_cache": opts.prefix_cache,
        "token_counts": "server usage" if prepared.usage else "stream chunks (the server sent no usage)",
    }


def sweep_receipt(target: Target, prepared: Prepared, method: dict[str, Any]) -> Receipt:
    """`method`: the sustained method's parameters as the result's config records them."""
    params = BenchParams("sustained", method, prompt_set_digest(prepared.prompt_words, bool(method.get("prefix_cache")))
                         if prepared.prompt_words else None)
    return assemble(target.base_url, target.served, prepared.server_version, params,
                    between(prepared.metrics_before, prepared.metrics_after))
