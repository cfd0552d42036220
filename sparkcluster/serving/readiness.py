"""Is vLLM serving? /health 200, /v1/models lists the served name, one short completion succeeds (which also
warms the JIT: the first request after a boot otherwise pays about 25 s of it). Each step has a deadline; between polls the caller checks that the
server's processes still live, since a poll on /health alone keeps waiting after the server died."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..engine.errors import SparkclusterError
from ..observe.bounded import request
from .apikey import bearer, unauthorized

# /health is one small HTTP request to the head, answered at once (refused while vLLM starts, then 200): polled 4x
# a second it costs nothing, and serve returns within a quarter second of vLLM being up, not within a second.
POLL_S = 0.25
COMPLETION_TIMEOUT_S = 120.0
# What serve and status read here (/health, the model list, a four-token completion) is a few KB: a body past this
# is no answer (an endless one ran `status` out of memory).
MAX_ANSWER_BYTES = 1 << 20


class NotReady(SparkclusterError):
    """vLLM did not become ready; the message says at which step and vLLM's own reason, the fix the rest."""


@dataclass(frozen=True)
class Diagnosis:
    """What the logs say of a server that is not ready: its first error ("" where they show none) and what to do,
    with where to read the logs whole."""

    cause: str
    fix: str


@dataclass(frozen=True)
class Readiness:
    health_s: float  # from the start of the wait until /health answered 200
    models_s: float
    completion_s: float
    completion_text: str


def http(url: str, body: dict[str, object] | None = None, timeout: float = 5.0,
         api_key: str | None = None) -> tuple[int, str]:
    """(status, text); status 0 when no whole answer came within `timeout` (the whole request's, not each read's)
    and MAX_ANSWER_BYTES. `api_key`: sent as vLLM wants it (a bearer token)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {**({"Content-Type": "application/json"} if data else {}), **bearer(api_key)}
    answer = request(url, timeout_s=timeout, limit_bytes=MAX_ANSWER_BYTES, data=data, headers=headers)
    return answer.status, answer.text


def served_models(text: str) -> list[str]:
    try:
        return [m["id"] for m in json.loads(text).get("data", [])]
    except (ValueError, AttributeError, KeyError, TypeError):
        return []


def wait_ready(base_url: str, served_name: str, deadline_s: float, still_running: Callable[[], str | None],
               diagnose: Callable[[], Diagnosis], api_key: str | None = None) -> Readiness:
    """Wait for the three checks in turn. `still_running` returns why the server is gone (or None while it
    runs); `diagnose` reads the logs for the error. `api_key`: the key vLLM was given,
    sent with every request (/health is not guarded; /v1 is)."""
    start = time.monotonic()
    deadline = start + deadline_s

    def fail(step: str) -> NotReady:
        found = diagnose()
        cause = f"\n  vLLM's error: {found.cause}" if found.cause else ""
        return NotReady(f"vLLM at {base_url} {step}{cause}", found.fix)

    last_check = 0.0
    while True:
        status, _ = http(f"{base_url}/health")
        if status == 200:
            break
        now = time.monotonic()
        if now - last_check >= 5:  # an ssh round trip per node: not every poll
            last_check = now
            gone = still_running()
            if gone:
                raise fail(f"stopped before it answered /health: {gone}")
        if now > deadline:
            raise fail(f"did not answer /health within {deadline_s:.0f} s (last status {status or 'no answer'})")
        time.sleep(POLL_S)
    health_s = time.monotonic() - start
    status, text = http(f"{base_url}/v1/models", timeout=30, api_key=api_key)
    if status == 401:
        raise unauthorized_to_serve(f"{base_url}/v1/models", api_key)
    if status != 200 or served_name not in served_models(text):
        raise fail(f"/v1/models answered {status} without {served_name!r} (it lists {served_models(text)})")
    models_s = time.monotonic() - start
    body = {"model": served_name, "prompt": "The DGX Spark is", "max_tokens": 4, "temperature": 0}
    status, text = http(f"{base_url}/v1/completions", body, timeout=COMPLETION_TIMEOUT_S, api_key=api_key)
    if status == 401:
        raise unauthorized_to_serve(f"{base_url}/v1/completions", api_key)
    try:
        completion = json.loads(text)["choices"][0]["text"] if status == 200 else None
    except (ValueError, KeyError, IndexError, TypeError):
        completion = None
    if completion is None:
        raise fail(f"a completion failed with HTTP {status}: {text.strip()[:300]}")
    return Readiness(health_s, models_s, time.monotonic() - start, completion)


def unauthorized_to_serve(url: str, api_key: str | None) -> NotReady:
    """A 401 to serve's own requests: vLLM wants a key serve did not give it (the node's environment or image sets
    VLLM_API_KEY), or another server answers on the port."""
    fix = ("give serve the key vLLM finds on the head (its environment or image sets VLLM_API_KEY): "
           "`-- --api-key KEY` or serve_env: {VLLM_API_KEY: KEY} in the inventory; or another server answers on "
           "that port: `sparkcluster down`, then serve again")
    return NotReady(unauthorized(url, api_key is not None)[0], fix)
