"""The served endpoint as every method reads it before its first measured request: one pool of requests (its
timeout and key), the model list (/v1/models: the model to measure and its served context) and each failure to
read it, worded once (BenchFailed, exit 1)."""

from __future__ import annotations

import asyncio

import aiohttp

from ..engine.errors import EXIT_FAILED, SparkclusterError
from ..serving.apikey import bearer, unauthorized
from .client import pool
from .context import max_model_len
from .sse import BadResponse, model_ids, read_document


class BenchFailed(SparkclusterError):
    """The endpoint refused, timed out or failed requests: exit 1, with the rows measured so far."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message, fix, EXIT_FAILED)


def requests_failed(where: str, failed: int, sent: int, first: str | None, fix: str) -> BenchFailed:
    """Requests of one step of a run failed (a concurrency's run, a llama-benchy cell): either method's in one
    wording, where, how many of how many, and the first one's error."""
    return BenchFailed(f"{where}: {failed} of {sent} requests failed; the first: {first}", fix)


def session(max_streams: int, timeout_s: float, api_key: str | None = None) -> aiohttp.ClientSession:
    """`timeout_s` bounds each request as a whole (aiohttp's `total` runs until the body is read), not only a
    silence: a server that keeps sending tokens or comments forever never stalls a read. `api_key` goes with
    every request the pool sends."""
    return pool(max_streams, spare=4, keepalive_s=60, headers=bearer(api_key),
                timeout=aiohttp.ClientTimeout(total=timeout_s, connect=10, sock_read=timeout_s))


def sends_key(client: aiohttp.ClientSession) -> bool:
    return "Authorization" in client.headers


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


FIX = ("check that the server runs (`sparkcluster status`) and that --url names its OpenAI base, "
       "e.g. http://HOST:8000/v1")


async def get_json(client: aiohttp.ClientSession, url: str) -> tuple[int, object]:
    """(status, document: None when not JSON); raises BenchFailed when nothing answers or the body is huge."""
    # A short document: 30 s at most, and never longer than one request may take (--timeout).
    timeout = aiohttp.ClientTimeout(total=min(30.0, client.timeout.total or 30.0))
    try:
        async with client.get(url, timeout=timeout) as response:
            return response.status, await read_document(response)
    except (aiohttp.ClientError, TimeoutError, OSError, BadResponse) as e:
        raise BenchFailed(describe_error(e, url), FIX) from None


async def resolve_model(client: aiohttp.ClientSession, base_url: str, wanted: str | None) -> tuple[str, int | None]:
    """The model to measure and its served context (None where the server does not list it)."""
    url = f"{base_url}/models"
    status, doc = await get_json(client, url)
    if status == 401:
        raise BenchFailed(*unauthorized(url, sends_key(client)))
    if status != 200:
        raise BenchFailed(f"{url} answered HTTP {status}, not a model list", FIX)
    try:
        served = model_ids(doc)
    except BadResponse as e:
        raise BenchFailed(f"{url} is not an OpenAI model list: {e}", FIX) from None
    if not served:
        raise BenchFailed(f"{url} lists no model", FIX)
    if wanted is not None and wanted not in served:
        shown = ", ".join(served[:10]) + (f" and {len(served) - 10} more" if len(served) > 10 else "")
        raise BenchFailed(f"{base_url} serves {shown}, not {wanted!r}", "give --model with a served name")
    model = served[0] if wanted is None else wanted
    return model, max_model_len(doc, model)
