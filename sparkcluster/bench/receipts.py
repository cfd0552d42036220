"""The receipt of each method's result, from what the target, the sweep and the endpoint already hold."""

from __future__ import annotations

import hashlib
import json
from array import array
from pathlib import Path
from typing import Any

from ..engine.localfiles import write_text
from ..observe.bounded import request
from ..observe.scrape import SCRAPE_TIMEOUT_S
from .methods.closed_loop import prompts
from .methods.closed_loop.sweep import Prepared, SweepOptions
from .methods.llama_benchy.corpus import Corpus
from .receipt import BenchParams, Receipt
from .receipt_metrics import Snapshot, between
from .receipt_sources import assemble
from .target import Target


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


def corpus_digest(corpus: Corpus) -> str:
    """llama-benchy's prompt set: slices of one corpus as its tokenizer cuts it, so the tokens themselves name it."""
    digest = hashlib.sha256(f"{corpus.tokenizer.name}\n".encode())
    digest.update(array("q", corpus.tokens).tobytes())
    return digest.hexdigest()


def endpoint_version(base_url: str) -> str | None:
    """What the endpoint's /version says (vLLM's release), None where it says nothing readable."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/version"
    answer = request(url, timeout_s=SCRAPE_TIMEOUT_S, limit_bytes=4096)  # the whole GET within the bound
    try:
        doc = json.loads(answer.body) if answer.status == 200 else None
    except ValueError:
        return None
    version = doc.get("version") if isinstance(doc, dict) else None
    return version if isinstance(version, str) else None


def benchy_receipt(target: Target, parameters: dict[str, Any], corpus: Corpus | None, before: Snapshot | None,
                   after: Snapshot | None) -> Receipt:
    """`parameters`: llama-benchy's own, as its document records them; the engine's /metrics from after the session's
    warm-up to the last cell (each cell's own warm-up run, part of llama-benchy's method, included)."""
    params = BenchParams("llama-benchy", parameters, corpus_digest(corpus) if corpus else None)
    version = None if target.served and target.served.vllm_build else endpoint_version(target.base_url)
    return assemble(target.base_url, target.served, version, params, between(before, after))


def receipt_path(output: Path) -> Path:
    """Where the receipt of a file whose format has no room for it goes: beside it (bench.csv.receipt.json)."""
    return output.with_name(output.name + ".receipt.json")


def save(path: Path, receipt: Receipt) -> Path:
    """Through engine/localfiles.py: a link planted at FILE.csv.receipt.json is replaced, never written through."""
    return write_text(path, json.dumps(receipt.to_json(), indent=2) + "\n")


def write_beside(output: Path, receipt: Receipt) -> Path:
    return save(receipt_path(output), receipt)


ARENA_RECEIPT = "receipt.json"  # in a profile's --out DIR, beside the Arena's own four files (whose format it keeps)
