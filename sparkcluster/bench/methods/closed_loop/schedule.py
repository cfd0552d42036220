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

from ....serving.apikey import bearer, request_error
from ...client import exchange, pool
from ...sse import BadResponse, error_message
from ...timeline import Exchange, RequestTimeline, RunTimeline


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # http://host:port/v1
    model: str


def session(max_streams: int, timeout_s: float, api_key: str | None = None) -> aiohttp.ClientSession:
    """`timeout_s` bounds each request as a whole (aiohttp's `total` runs until the body is read), not only a
    silence: a server that keeps sending tokens or comments forever never stalls a read. `api_key` goes with
    every request the pool sends."""
    return pool(max_streams, spare=4, keepalive_s=60, headers=bearer(api_key),
                timeout=aiohttp.ClientTimeout(total=timeout_s, connect=10, sock_read=timeout_s))


def sends_key(client: aiohttp.ClientSession) -> bool:
    return "Authorization" in client.headers


def request_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}


def describe_error(error: BaseException, url: str) -> str:
    if isinstance(error, aiohttp.ClientConnectorError):
        return f"nothing answers at {url}: {error.os_error.strerror or error}"
    if isinstance(error, aiohttp.ServerTimeoutError):
        return f"{url} sent nothing for longer than the timeout"
    if isinstance(error, asyncio.TimeoutError):
        return f"{url} did not finish within the timeout"
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return f"{url} closed the connection mid-stream"
    if isinstance(error, BadResponse):
        return f"{url}: {error}"
    return f"{url}: {type(error).__name__}: {error}".rstrip(": ")


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
