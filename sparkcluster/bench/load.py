"""The load generator: one asyncio event loop and one aiohttp session hold C streamed completions in flight.

Why hand-written on aiohttp: vLLM's `vllm bench serve` needs a tokenizer for its prompts (no offline use
against an endpoint whose model is not in the local HF cache) and brings all of vLLM and torch; llama-benchy
needs a tokenizer and a downloaded book for its prompts, and sends each concurrency as one batch rather than
keeping C in flight. Both read usage and time chunks the same way as this client. At 256 streams against the
same server (benchmarks/bench_client.py), aiohttp parsed ~72,000 output tokens per client CPU second (~53,000
with every token in its own read) and httpx ~10,600 (~7,000). One coroutine per stream, never a thread per request.

Requests go to /v1/completions with `stream_options.include_usage` (token counts are the server's) and
`ignore_eos` (every request produces exactly --output-tokens, as the published figures do).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..serving.apikey import bearer, request_error
from .sse import BadResponse, Usage, data_lines, error_message, parse_event
from .timeline import RequestTimeline, RunTimeline


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # http://host:port/v1
    model: str


def session(max_streams: int, timeout_s: float, api_key: str | None = None) -> aiohttp.ClientSession:
    """One pool for the whole sweep: connections are reused between requests, as a real client's are.
    `timeout_s` bounds each request as a whole (aiohttp's `total` runs until the body is read), not only a
    silence: a server that keeps sending tokens or comments forever never stalls a read. `api_key` goes with
    every request the pool sends."""
    connector = aiohttp.TCPConnector(limit=max_streams + 4, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=10, sock_read=timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, headers=bearer(api_key))


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


async def stream_completion(client: aiohttp.ClientSession, endpoint: Endpoint, prompt: str,
                            max_tokens: int) -> RequestTimeline:
    """One streamed completion, timed at each network read (every event in one read arrived together)."""
    url = f"{endpoint.base_url}/completions"
    start = time.perf_counter()
    token_times: list[float] = []
    closing_times: list[float] = []  # empty chunks that ended the stream: a token only if usage says so
    usage: Usage | None = None
    try:
        async with client.post(url, json=request_body(endpoint.model, prompt, max_tokens)) as response:
            if response.status != 200:
                text = error_message((await response.content.read(2000)).decode(errors="replace").strip())
                return RequestTimeline(start, time.perf_counter(), status=response.status,
                                       error=request_error(response.status, text[:600], sends_key(client)))
            async for now, payload in data_lines(response.content):
                event = parse_event(payload)
                if event.error is not None:
                    return RequestTimeline(start, now, tuple(token_times), error=f"server error: {event.error}")
                if event.choices:
                    (token_times if event.choices[0].carries_output else closing_times).append(now)
                usage = event.usage or usage
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:  # BadResponse is a ValueError
        return RequestTimeline(start, time.perf_counter(), tuple(token_times), error=describe_error(e, url))
    end = time.perf_counter()
    missing = (usage.completion_tokens if usage else 0) - len(token_times)
    if missing > 0 and closing_times:  # the last token decoded to no text (vLLM holds back partial characters)
        token_times = sorted(token_times + closing_times[:missing])
    if not token_times:
        return RequestTimeline(start, end, error="the stream ended without output")
    if usage is None:
        return RequestTimeline(start, end, tuple(token_times), 0, len(token_times), usage=False)
    return RequestTimeline(start, end, tuple(token_times), usage.prompt_tokens, usage.completion_tokens)


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
