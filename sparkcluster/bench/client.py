"""The one HTTP client of every bench method: a connection pool, and one streamed request read into an `Exchange`
(timeline.py). The methods differ in what they send (their request bodies), when (their schedules) and what they
compute (their arithmetic), never in how a stream is read or timed: each network read is stamped once, and every
event in it shares that time, since they arrived together.

Why hand-written on aiohttp: vLLM's `vllm bench serve` needs a tokenizer for its prompts and brings all of vLLM
and torch; llama-benchy is reproduced here request for request (methods/llama_benchy) rather than run, so one
client reads both. At 256 streams against the same server (benchmarks/bench_client.py), aiohttp parsed ~72,000
output tokens per client CPU second (~53,000 with every token in its own read) and httpx ~10,600 (~7,000). One
coroutine per stream, never a thread per request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from .sse import data_lines, parse_event
from .timeline import Chunk, Exchange

REFUSAL_BYTES = 2000


def pool(max_streams: int, *, spare: int, keepalive_s: float, timeout: aiohttp.ClientTimeout,
         headers: Mapping[str, str] | None = None) -> aiohttp.ClientSession:
    """One pool for a whole run: connections are reused between requests, as a real client's are; `spare`
    connections beyond the streams for the probes beside them; `headers` go with every request."""
    connector = aiohttp.TCPConnector(limit=max_streams + spare, keepalive_timeout=keepalive_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers)


def token_id_count(payload: bytes) -> int | None:
    """How many `token_ids` the first choice carries (vLLM sends them when asked); None when absent or not a
    list of ints. sse.py's event does not keep them, so they are read here, only from chunks that have them."""
    if b'"token_ids"' not in payload:
        return None
    doc = json.loads(payload)  # parse_event has just parsed it: it is a JSON object with a list of choices
    ids = doc["choices"][0].get("token_ids") if isinstance(doc["choices"][0], dict) else None
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return len(ids)
    return None


async def exchange(session: aiohttp.ClientSession, url: str, body: dict[str, Any], *,
                   headers: Mapping[str, str] | None = None, deadline_s: float | None = None) -> Exchange:
    """POST one streamed request and read it to its end, its failure or `deadline_s` (None: the pool's timeout
    alone bounds it). Nothing raises: what went wrong is in the exchange, for the method to word."""
    result = Exchange(time.perf_counter())
    try:
        async with asyncio.timeout(deadline_s):
            async with session.post(url, json=body, headers=headers) as response:
                result.status = response.status
                if response.status != 200:
                    result.refusal = (await response.content.read(REFUSAL_BYTES)).decode(errors="replace")
                    result.end = time.perf_counter()
                    return result
                async for arrived, payload in data_lines(response.content):
                    event = parse_event(payload)
                    if event.error is not None:
                        result.server_error, result.end = event.error, arrived
                        return result
                    if event.usage is not None:
                        result.usages.append(event.usage)
                    if event.choices:
                        choice = event.choices[0]
                        result.chunks.append(Chunk(choice.text or "", arrived, token_id_count(payload),
                                                   choice.finish_reason))
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:  # BadResponse is a ValueError
        result.failure = e
    result.end = time.perf_counter()
    return result
