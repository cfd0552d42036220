"""The closed loop's load: C streams share the prompts, each sending the next as soon as its last request ended,
so C requests stay in flight (llama-benchy instead sends each concurrency as one burst: methods/llama_benchy).

Requests go to /v1/completions with `stream_options.include_usage` (token counts are the server's) and
`ignore_eos` (every request produces exactly --output-tokens, as the published figures do), through the one
client (client.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from ....serving.apikey import request_error
from ...client import exchange
from ...endpoint import describe_error, sends_key
from ...sse import error_message
from ...timeline import Exchange, RequestTimeline, RunTimeline


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # http://host:port/v1
    model: str


def request_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}


def request_timeline(seen: Exchange, url: str, key_sent: bool) -> RequestTimeline:
    """What the closed loop's arithmetic reads of an exchange: the times of the chunks that carried output."""
    token_times = [c.timestamp for c in seen.chunks if c.carries_output]
    if seen.refused:
        text = error_message(seen.refusal.strip())
        return RequestTimeline(seen.start, seen.end, status=seen.status,
                               error=request_error(seen.status, text[:600], key_sent))
    if seen.server_error is not None:
        return RequestTimeline(seen.start, seen.end, tuple(token_times), error=f"server error: {seen.server_error}")
    if seen.failure is not None:
        return RequestTimeline(seen.start, seen.end, tuple(token_times), error=describe_error(seen.failure, url))
    usage = seen.usage
    missing = (usage.completion_tokens if usage else 0) - len(token_times)
    closing_times = [c.timestamp for c in seen.chunks if not c.carries_output]
    if missing > 0 and closing_times:  # the last token decoded to no text (vLLM holds back partial characters)
        token_times = sorted(token_times + closing_times[:missing])
    if not token_times:
        return RequestTimeline(seen.start, seen.end, error="the stream ended without output")
    if usage is None:
        return RequestTimeline(seen.start, seen.end, tuple(token_times), 0, len(token_times), usage=False)
    return RequestTimeline(seen.start, seen.end, tuple(token_times), usage.prompt_tokens, usage.completion_tokens)


async def stream_completion(client: aiohttp.ClientSession, endpoint: Endpoint, prompt: str,
                            max_tokens: int) -> RequestTimeline:
    """One streamed completion, timed at each network read (every event in one read arrived together)."""
    url = f"{endpoint.base_url}/completions"
    seen = await exchange(client, url, request_body(endpoint.model, prompt, max_tokens))
    return request_timeline(seen, url, sends_key(client))


async def run_concurrency(client: aiohttp.ClientSession, endpoint: Endpoint, prompts: Sequence[str],
                          concurrency: int, max_tokens: int,
                          on_done: Callable[[RequestTimeline], None] = lambda r: None) -> RunTimeline:
    """C streams share the prompts: each sends the next as soon as its last request ended, so C requests stay
    in flight until the prompts run out. After a failed request no stream starts another (the sweep stops
    there); the requests in flight finish."""
    done: list[RequestTimeline] = []
    next_index = 0
    failed = False
    ran_dry: list[float] = []

    async def stream() -> None:
        nonlocal next_index, failed
        while next_index < len(prompts) and not failed:
            prompt = prompts[next_index]
            next_index += 1
            result = await stream_completion(client, endpoint, prompt, max_tokens)
            failed = failed or not result.ok
            done.append(result)
            on_done(result)
        ran_dry.append(time.perf_counter())

    start = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(concurrency)))
    return RunTimeline(concurrency, tuple(done), (start, min(ran_dry)))
