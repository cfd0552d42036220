"""llama-benchy 0.4.0's requests, sent the way it sends them and timed the way it times them: streamed chat
completions (the context as a system message, the prompt as the user's), `return_token_ids` and usage asked
for, each network read stamped once; warm-up, coherence question and latency probe as it does them.

What differs is only what a hostile server can do to the client: streams are read through sse.py (a line
capped, every field checked), every request is bounded by a total deadline, and a bad answer makes that
request an error with the reason instead of a traceback or a hang.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ....engine.errors import SparkclusterError
from ....serving.apikey import bearer, request_error, unauthorized
from ...client import exchange
from ...sse import BadResponse, data_lines, read_document
from ...timeline import Chunk, Exchange

CONTEXT_LOAD_USER_MESSAGE = "."  # vLLM rejects an empty user turn; llama-benchy's context load sends this
COHERENCE_PROMPT = "What is the capital of France? Please reply with one word only"
WARMUP_TEXT = "Warmup " * 10


@dataclass
class RequestResult:
    """One request's clock readings (time.perf_counter seconds), as llama-benchy's RequestResult."""
    start_ts: float = 0.0
    end_ts: float = 0.0
    first_token_ts: float | None = None
    first_response_ts: float | None = None
    prompt_tokens: int = 0
    total_tokens: int = 0
    error: str | None = None
    token_timestamps: list[float] = field(default_factory=list)


@dataclass
class Tally:
    """Every token the server reported for this session's requests (usage), and how many the client counted
    (token_ids, else usage, else chunks): a check against the server's own counters."""
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    counted_tokens: int = 0

    def to_json(self) -> dict[str, int]:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "counted_tokens": self.counted_tokens}


@dataclass(frozen=True)
class Client:
    base_url: str
    model: str
    timeout: float  # seconds one request may take in all
    api_key: str | None = field(default=None, repr=False)  # None: llama-benchy's placeholder, "EMPTY"
    tally: Tally = field(default_factory=Tally)

    @property
    def headers(self) -> dict[str, str]:
        return bearer(self.api_key or "EMPTY")

    def payload(self, messages: list[dict[str, str]], max_tokens: int, no_cache: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                                "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
        if no_cache:
            body["cache_prompt"] = False
        return body

    async def generate(self, session: aiohttp.ClientSession, context: str, prompt: str, max_tokens: int,
                       no_cache: bool = False) -> RequestResult:
        messages = [{"role": "system", "content": context}] if context else []
        messages.append({"role": "user", "content": prompt if prompt.strip() else CONTEXT_LOAD_USER_MESSAGE})
        seen = await exchange(session, f"{self.base_url}/chat/completions", self.payload(messages, max_tokens, no_cache),
                              headers=self.headers, deadline_s=self.timeout)
        return self.result(seen)

    def result(self, seen: Exchange) -> RequestResult:
        """llama-benchy's reading of an exchange: the first choice's arrival, the first token's, the token times
        (finalize); the tally counts what the server reported and what was counted."""
        url = f"{self.base_url}/chat/completions"
        result = RequestResult(start_ts=seen.start)
        if seen.refused:
            result.error = request_error(seen.status, seen.refusal[:300].strip(), self.api_key is not None)
            return result
        if seen.status == 200:
            self.tally.requests += 1
        for usage in seen.usages:
            result.prompt_tokens = usage.prompt_tokens
            self.tally.prompt_tokens += usage.prompt_tokens
            self.tally.completion_tokens += usage.completion_tokens
        tokens = [c for c in seen.chunks if c.text]  # content, reasoning_content or reasoning: a token
        result.first_response_ts = seen.chunks[0].timestamp if seen.chunks else None
        result.first_token_ts = tokens[0].timestamp if tokens else None
        if seen.server_error is not None:
            result.error = f"the server reported: {seen.server_error}"
        elif isinstance(seen.failure, TimeoutError):
            result.error = f"{url} took longer than --timeout {self.timeout:g} s"
        elif isinstance(seen.failure, BadResponse):
            result.error = f"{url}: {seen.failure}"
        elif seen.failure is not None:
            result.error = f"{url}: {type(seen.failure).__name__}: {seen.failure}".rstrip(": ")
        elif not seen.chunks:  # a real server's stream always carries a choice
            result.error = f"{url}: the stream ended without output (not one choice: no token, no finish_reason)"
        else:
            finalize(result, tokens, seen.usage.completion_tokens if seen.usage else None)
            self.tally.counted_tokens += result.total_tokens
            result.end_ts = seen.end
        return result


def _append_observed(result: RequestResult, at: float, count: int) -> None:
    """Tokens of one chunk: one at its arrival, several spread evenly since the previous token."""
    if count <= 0:
        return
    if count == 1:
        result.token_timestamps.append(at)
        return
    last = result.token_timestamps[-1] if result.token_timestamps else result.first_token_ts
    last = result.start_ts if last is None else last
    window = at - last
    result.token_timestamps.extend(last + window * (i + 1) / count for i in range(count))


def interpolate(times: list[float], count: int) -> list[float]:
    """`count` token times spread evenly from the first chunk to the last."""
    if count <= 0 or not times:
        return []
    if count == 1 or len(times) == 1 or times[-1] <= times[0]:
        return [times[0]] * count
    step = (times[-1] - times[0]) / (count - 1)
    return [times[0] + step * i for i in range(count)]


def finalize(result: RequestResult, chunks: list[Chunk], usage_completion: int | None) -> None:
    """Token count and token times as llama-benchy settles them: from token_ids when every chunk has them,
    else the server's usage spread over the chunks, else one token per chunk."""
    if not chunks:
        if usage_completion is not None:
            result.total_tokens = usage_completion
        return
    if all(c.token_ids is not None for c in chunks):
        for c in chunks:
            result.total_tokens += c.token_ids or 0
            _append_observed(result, c.timestamp, c.token_ids or 0)
        return
    times = [c.timestamp for c in chunks]
    if usage_completion is not None:
        result.total_tokens = usage_completion
        result.token_timestamps = interpolate(times, usage_completion)
        return
    result.total_tokens = len(chunks)
    result.token_timestamps = times


async def _post_json(client: Client, session: aiohttp.ClientSession, body: dict[str, Any]) -> dict[str, Any]:
    """A chat completion that is not streamed: its document, bounded in size and time; BadResponse otherwise."""
    async with asyncio.timeout(client.timeout):
        async with session.post(f"{client.base_url}/chat/completions", json=body,
                                headers=client.headers) as response:
            if response.status == 401:  # no request will pass: said as such, not as a bad answer
                raise SparkclusterError(*unauthorized(f"{client.base_url}/chat/completions",
                                                      client.api_key is not None))
            if response.status != 200:
                text = (await response.content.read(300)).decode("utf-8", "replace").strip()
                raise BadResponse(f"HTTP {response.status}: {text}")
            doc = await read_document(response)
    if not isinstance(doc, dict):
        raise BadResponse("the answer is not a JSON object")
    client.tally.requests += 1
    usage = doc.get("usage")
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key) if isinstance(usage, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            setattr(client.tally, key, getattr(client.tally, key) + value)
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        client.tally.counted_tokens += usage["completion_tokens"]  # not streamed: only usage counts them
    return doc


def _usage_prompt(doc: dict[str, Any]) -> int | None:
    usage = doc.get("usage")
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


async def probe_prompt(client: Client, session: aiohttp.ClientSession, system: str | None, user: str) -> int | None:
    """The server's prompt_tokens for one 1-token chat request (None when it reports no usage)."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": user}]
    return _usage_prompt(await _post_json(client, session, {"model": client.model, "messages": messages,
                                                             "max_tokens": 1}))


async def coherence(client: Client, session: aiohttp.ClientSession) -> tuple[bool, str]:
    """llama-benchy's coherence question; (passed, what the model answered)."""
    doc = await _post_json(client, session, {"model": client.model, "max_tokens": 100,
                                             "messages": [{"role": "user", "content": COHERENCE_PROMPT}]})
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False, "(no choices in the answer)"
    message = choices[0].get("message")
    message = message if isinstance(message, dict) else {}
    parts = [message.get(k) for k in ("content", "reasoning", "reasoning_content")]
    content = str(parts[0] or "")
    reasoning = str(parts[1] or parts[2] or "")
    return "paris" in (content + reasoning).lower(), content[:200]


async def latency(client: Client, session: aiohttp.ClientSession, mode: str) -> float:
    """Seconds of round trip, llama-benchy's way: mean of 3 GET /models (api), of 3 first bytes of a 1-token
    request (generation), or 0 (none). Failed probes are left out, as llama-benchy leaves them out."""
    if mode == "none":
        return 0.0
    samples: list[float] = []
    for _ in range(3):
        start = time.perf_counter()
        try:
            async with asyncio.timeout(client.timeout):
                if mode == "api":
                    async with session.get(f"{client.base_url}/models", headers=client.headers) as response:
                        await response.content.read(1 << 20)
                    samples.append(time.perf_counter() - start)
                else:
                    body = {"model": client.model, "messages": [{"role": "user", "content": "hello"}],
                            "max_tokens": 1, "stream": True}
                    async with session.post(f"{client.base_url}/chat/completions", json=body,
                                            headers=client.headers) as response:
                        first = None
                        async for _ in data_lines(response.content):  # read to the end, as llama-benchy
                            first = first or time.perf_counter() - start  # does: the connection is reused
                        if first is not None:
                            samples.append(first)
        except (TimeoutError, aiohttp.ClientError, BadResponse):
            continue
    return sum(samples) / len(samples) if samples else 0.0
