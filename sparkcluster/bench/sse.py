"""Reading what an OpenAI-compatible server streams, trusting none of it: every field bench reads is checked where
it is read, so a server that sends the wrong shape makes that request an error with the reason, never a traceback.

A stream is Server-Sent Events: `data: {json}` lines, `: comment` lines, blank separators, `data: [DONE]` at the
end. A line is held in memory only up to MAX_EVENT_BYTES (a real event is a few hundred bytes; a server that
sends megabytes without a line break is broken), and how long a stream may run is bounded by the caller's
deadline, since a server that keeps sending tokens or comments forever never stalls a read.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

MAX_EVENT_BYTES = 1 << 20
MAX_DOCUMENT_BYTES = 8 << 20  # /v1/models, /version: a list of models, never a stream of gigabytes


class BadResponse(ValueError):
    """What the server sent is not what an OpenAI-compatible server sends; the message says what it was."""


@dataclass(frozen=True)
class Choice:
    text: str | None  # `text` (completions) or the delta's content or reasoning (chat); None when absent
    finish_reason: str | None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class StreamEvent:
    choices: tuple[Choice, ...] = ()
    usage: Usage | None = None
    error: str | None = None  # vLLM reports a failure mid-stream as an event


def _shape(value: object) -> str:
    text = json.dumps(value)[:80] if isinstance(value, (dict, list, str, int, float, bool, type(None))) else "?"
    return f"{type(value).__name__} {text}"


def _optional_text(value: object, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise BadResponse(f"{where} is {_shape(value)}, not text")


def _choice(value: object) -> Choice:
    if not isinstance(value, dict):
        raise BadResponse(f"a choice is {_shape(value)}, not an object")
    text = _optional_text(value.get("text"), "a choice's text")
    if text is None:
        delta = value.get("delta")
        if delta is not None and not isinstance(delta, dict):
            raise BadResponse(f"a choice's delta is {_shape(delta)}, not an object")
        delta = delta or {}
        text = next((t for key in ("content", "reasoning_content", "reasoning")
                     if (t := _optional_text(delta.get(key), f"the delta's {key}"))), None)
    return Choice(text, _optional_text(value.get("finish_reason"), "finish_reason"))


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadResponse(f"usage.{key} is {_shape(value)}, not a token count")
    return value


def error_message(body: str) -> str:
    """What a refusing server says: the `message` of an OpenAI error document (vLLM's `{"error": {"message":
    ...}}`, or its older top-level `message`), else the body as it came."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return body
    error = doc.get("error") if isinstance(doc, dict) else None
    for holder in (error, doc):
        message = holder.get("message") if isinstance(holder, dict) else None
        if isinstance(message, str) and message.strip():
            return message.strip()
    return body


def parse_event(payload: bytes) -> StreamEvent:
    """One `data:` payload (not [DONE]) as a checked event; BadResponse says what was wrong with it."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        raise BadResponse(f"an event is not JSON: {payload[:80]!r}") from None
    if not isinstance(doc, dict):
        raise BadResponse(f"an event is {_shape(doc)}, not an object")
    if "error" in doc:
        error = doc["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return StreamEvent(error=str(message)[:300])
    choices = doc.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise BadResponse(f"choices is {_shape(choices)}, not a list")
    usage = doc.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise BadResponse(f"usage is {_shape(usage)}, not an object")
    return StreamEvent(tuple(_choice(c) for c in choices or ()),
                       Usage(_count(usage, "prompt_tokens"), _count(usage, "completion_tokens")) if usage else None)


async def data_lines(content: aiohttp.StreamReader, limit: int = MAX_EVENT_BYTES
                     ) -> AsyncIterator[tuple[float, bytes]]:
    """(arrival time, payload) of each `data:` line but the closing [DONE]. Lines that arrive in one network
    read share its time: they arrived together. Raises BadResponse for a line longer than `limit`."""
    pending = b""
    async for data in content.iter_any():
        now = time.perf_counter()
        *lines, pending = (pending + data).split(b"\n")
        if len(pending) > limit:
            raise BadResponse(f"the server sent more than {limit >> 10} KiB without a line break")
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload != b"[DONE]":
                    yield now, payload


async def read_document(response: aiohttp.ClientResponse, limit: int = MAX_DOCUMENT_BYTES) -> object:
    """A JSON document of at most `limit` bytes (None when it is not JSON); BadResponse when it is larger."""
    body = b""
    async for data in response.content.iter_any():  # read(n) returns what has arrived, not n bytes
        body += data
        if len(body) > limit:
            raise BadResponse(f"the answer is larger than {limit >> 20} MiB")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def model_ids(doc: object) -> list[str]:
    """The served names in a /v1/models document (maybe none); BadResponse when it is not a list of models."""
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise BadResponse(f"its `data` is {_shape(data)}, not a list of models")
    ids = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]
    if len(ids) != len(data):
        raise BadResponse(f"its `data` holds {_shape(data)}, not models with an `id`")
    return ids
