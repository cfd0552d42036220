"""`sparkcluster bench --url` against tests/support/hostile_server.py, one route per misbehaviour seen in the round-3
adversarial run: each ends within its timeout, exit 0 or 1, a reason and no traceback; the parsers behind it are
fuzzed with hypothesis (a value or a clean error, never an exception)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkcluster.bench.sse import BadResponse, StreamEvent, model_ids, parse_event
from tests.support.helpers import run_cli
from tests.support.hostile_server import ENDLESS_MODES, EVENT_MODES, METRICS_MODES, MODELS_MODES, SCRAPE_MODES
from tests.support.openai_stub import running_server

TIMEOUT_S = 3  # --timeout: the bound on one request, and so on every endless route below


@pytest.fixture(scope="module")
def hostile() -> str:
    with running_server("tests.support.hostile_server") as port:
        yield f"http://127.0.0.1:{port}"


# Each method's smallest run: the closed loop, and llama-benchy's bursts (a corpus of our own, no tokenizer).
METHODS = {
    "sustained": ("--concurrency", "1,2", "--runs", "1", "--requests-per-stream", "1", "--output-tokens", "4",
                  "--prompt-tokens", "8", "--warmup", "0"),
    "llama-benchy": ("--method", "llama-benchy", "--pp", "8", "--tg", "4", "--concurrency", "1", "2", "--runs", "1",
                     "--no-warmup", "--skip-coherence", "--latency-mode", "none"),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "book.txt"
    path.write_text("the quick brown fox jumps over the lazy dog and runs away into the wood " * 400)
    return str(path)


# The shared reader is what both methods stand on: every route against the closed loop, and one of each kind
# against llama-benchy's client (its own requests, warm-up and arithmetic around the same reader).
LLAMA_BENCHY_SAMPLE = {"choices-int", "choices-null", "event-not-json", "usage-str", "error-int",
                       "models-data-strings", "metrics-nan", "stream-endless-tokens", "stream-no-line-break",
                       "accept-never-answer"}


def cases(modes) -> list:
    return [pytest.param(method, mode, id=f"{method}-{mode}") for mode in sorted(modes) for method in METHODS
            if method == "sustained" or mode in LLAMA_BENCHY_SAMPLE]


def bench(method: str, url: str, corpus: str) -> tuple[object, float]:
    extra = ("--corpus", corpus) if method == "llama-benchy" else ()
    started = time.monotonic()
    result = run_cli("bench", "--url", url, *METHODS[method], *extra, "--timeout", str(TIMEOUT_S), "--json",
                     timeout=120)
    return result, time.monotonic() - started


def error_of(result) -> dict:
    """The error of either method's document: ours at the top, llama-benchy's under our one extra key."""
    doc = json.loads(result.stdout)
    return doc.get("error") or (doc.get("sparkcluster") or {}).get("error") or {}


def reason_of(result) -> str:
    return error_of(result).get("message", "")


def measured_concurrencies(result) -> list[int]:
    doc = json.loads(result.stdout)
    return [row["concurrency"] for row in doc["rows" if "rows" in doc else "benchmarks"]]


@pytest.mark.parametrize("method, mode", cases(EVENT_MODES))
def test_an_event_of_the_wrong_shape_is_a_failed_request_with_its_reason(hostile, corpus, method, mode):
    result, _ = bench(method, f"{hostile}/{mode}/v1", corpus)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    reason = reason_of(result)
    assert any(why in reason for why in ("is ", "server error", "server reported", "without output")), reason


@pytest.mark.parametrize("method, mode", cases(MODELS_MODES))
def test_a_model_list_of_the_wrong_shape_is_an_error_with_the_fix(hostile, corpus, method, mode):
    result, _ = bench(method, f"{hostile}/{mode}/v1", corpus)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1
    assert "/models" in reason_of(result) and error_of(result)["fix"]


@pytest.mark.parametrize("method, mode", cases(METRICS_MODES))
def test_metrics_that_are_not_numbers_never_stop_a_run(hostile, corpus, method, mode):
    result, _ = bench(method, f"{hostile}/{mode}/v1", corpus)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    assert measured_concurrencies(result) == [1, 2] and not error_of(result)


@pytest.mark.parametrize("method, mode", cases(ENDLESS_MODES))
def test_an_endless_or_silent_answer_is_bounded_by_the_timeout(hostile, corpus, method, mode):
    result, took = bench(method, f"{hostile}/{mode}/v1", corpus)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    assert reason_of(result)
    # The bound is per request: the model list, one calibration request, no more (plus the CLI's start).
    assert took < 4 * TIMEOUT_S + 20, took


@pytest.mark.parametrize("mode", SCRAPE_MODES)
def test_top_shows_a_broken_scrape_as_such(hostile, mode):
    started = time.monotonic()
    result = run_cli("top", "--url", f"{hostile}/{mode}/v1", "--once", "--json", timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 1) and time.monotonic() - started < 60
    endpoint = json.loads(result.stdout)["endpoint"]
    assert endpoint["error"] or endpoint["figures"] is not None, endpoint


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
# Shapes close to a real event, so the fuzz reaches the checks of each field and not only the top level.
EVENT = st.fixed_dictionaries({}, optional={
    "choices": JSON | st.lists(JSON | st.fixed_dictionaries({}, optional={
        "text": JSON, "finish_reason": JSON, "delta": JSON | st.dictionaries(
            st.sampled_from(["content", "reasoning_content", "reasoning"]), JSON)}), max_size=3),
    "usage": JSON | st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens"]), JSON),
    "error": JSON,
})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(EVENT, JSON).map(lambda doc: json.dumps(doc).encode()) | st.binary(max_size=64))
def test_any_event_is_a_checked_value_or_a_clean_error(payload):
    try:
        event = parse_event(payload)
    except BadResponse as e:
        assert str(e)
        return
    assert isinstance(event, StreamEvent)
    assert all(c.text is None or isinstance(c.text, str) for c in event.choices)
    assert event.usage is None or (isinstance(event.usage.prompt_tokens, int)
                                   and isinstance(event.usage.completion_tokens, int))


@settings(max_examples=300, deadline=None)
@given(JSON | st.fixed_dictionaries({"data": JSON | st.lists(st.dictionaries(st.just("id"), JSON), max_size=3)}))
def test_any_model_list_is_names_or_a_clean_error(doc):
    try:
        ids = model_ids(doc)
    except BadResponse as e:
        assert str(e)
        return
    assert all(isinstance(i, str) and i for i in ids)


def test_a_line_over_the_cap_is_refused_without_holding_more():
    from sparkcluster.bench.sse import data_lines

    class Content:
        async def iter_any(self):
            for _ in range(100):
                yield b"data: " + b"x" * 65536

    async def read() -> str:
        try:
            async for _ in data_lines(Content(), limit=256 * 1024):  # type: ignore[arg-type]
                pass
        except BadResponse as e:
            return str(e)
        return ""

    assert "without a line break" in asyncio.run(read())
