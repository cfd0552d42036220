"""bench and the served context (issue 43): against a vLLM serving --max-model-len 512, bench's default prompt and
output (512 and 128) got HTTP 400 ("maximum context length is 512 tokens ... 513 input tokens") and said to check
that the server runs. Now the defaults are fitted to the context /v1/models lists, sizes given that cannot fit are
refused up front with the numbers, and a 400 is told by the server's own message. Against tests/support/openai_stub.py
speaking vLLM's words (tests/fixtures/vllm/cpu-0.32-400-*.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkcluster.bench.context import DoesNotFit, Sizes, fit, max_model_len
from sparkcluster.bench.sse import error_message
from tests.support.helpers import run_cli
from tests.support.openai_stub import running_stub

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
ONCE = ("--concurrency", "1", "--runs", "1", "--requests-per-stream", "1", "--warmup", "0")


def bench(url: str, *flags: str) -> tuple[int, dict, str]:
    result = run_cli("bench", "--url", url, "--json", *ONCE, *flags, timeout=60)
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, " ".join(
        result.stderr.split())


def test_the_issues_defaults_against_a_512_token_context_are_fitted_and_measured():
    """Failed before: exit 1, `HTTP 400: {"error": {"message": "This model's maximum context length is 512 ..."`,
    fix "check that the server runs"."""
    with running_stub(max_model_len=512) as url:
        code, doc, err = bench(url)
    assert code == 0, err
    method = doc["config"]["method"]
    assert (method["prompt_tokens"], method["output_tokens"], method["max_model_len"]) == (256, 64, 512), method
    row = doc["rows"][0]
    assert row["errors"] == 0 and row["completion_tokens"] == 64 and abs(row["prompt_tokens"] - 256) <= 3, row


def test_a_server_that_lists_no_context_keeps_the_defaults():
    with running_stub() as url:
        code, doc, err = bench(url)
    assert code == 0, err
    method = doc["config"]["method"]
    assert (method["prompt_tokens"], method["output_tokens"], method["max_model_len"]) == (512, 128, None)


def test_sizes_given_that_cannot_fit_are_refused_with_the_numbers_before_any_is_measured():
    with running_stub(max_model_len=512) as url:
        code, doc, err = bench(url, "--prompt-tokens", "500", "--output-tokens", "100")
    assert code == 2, err
    assert ("--prompt-tokens 500 and --output-tokens 100 cannot fit the served context: the server's max_model_len "
            "is 512 tokens (its /v1/models), and a request's prompt and output (500 + 100 = 600 tokens) must fit in "
            "it") in err, err
    assert "fix: give --prompt-tokens and --output-tokens that sum to 512 or less, e.g. --prompt-tokens 250 " \
           "--output-tokens 50" in err
    assert doc["rows"] == [] and doc["error"]["message"].startswith("--prompt-tokens 500 and --output-tokens 100")


def test_an_http_400_is_told_by_the_servers_own_message_not_as_a_server_that_is_down():
    message = json.loads((FIXTURES / "cpu-0.32-400-prompt-too-long.json").read_text())["error"]["message"]
    with running_stub(refuse=message) as url:
        code, doc, err = bench(url, "--prompt-tokens", "32", "--output-tokens", "8")
    assert code == 1, err
    assert f"the first request failed: HTTP 400: {message}" in err, err  # failed before: the JSON document, cut
    assert "check that the server runs" not in err and "the server refused the request as sent" in err, err


@pytest.mark.parametrize("name", ["cpu-0.32-400-prompt-too-long.json", "cpu-0.32-400-max-tokens.json"])
def test_vllms_error_documents_read_as_their_message(name):
    body = (FIXTURES / name).read_text()
    assert error_message(body) == json.loads(body)["error"]["message"]
    assert error_message("upstream timed out") == "upstream timed out"  # not JSON: the body as it came


def test_the_context_is_read_for_the_measured_model_only():
    doc = {"data": [{"id": "a", "max_model_len": 512}, {"id": "b"}, {"id": "c", "max_model_len": True}]}
    assert (max_model_len(doc, "a"), max_model_len(doc, "b"), max_model_len(doc, "c")) == (512, None, None)


@pytest.mark.parametrize("sizes, context, fitted", [
    (Sizes(512, 128, False, False), 512, (256, 64)),
    (Sizes(512, 128, False, False), 384, (128, 32)),
    (Sizes(512, 128, False, False), 2048, (512, 128)),
    (Sizes(300, 128, True, False), 384, (300, 64)),  # a prompt given is kept; the default output makes room
    (Sizes(500, 12, True, True), 512, (500, 12)),  # given, and fits: kept, however tight
])
def test_defaults_are_halved_to_fit_and_given_sizes_kept(sizes, context, fitted):
    got = fit(sizes, context)
    assert (got.prompt_tokens, got.output_tokens) == fitted


def test_a_given_size_that_leaves_no_room_is_refused():
    with pytest.raises(DoesNotFit) as e:
        fit(Sizes(512, 128, True, False), 512)
    assert e.value.exit_code == 2 and e.value.message.startswith("--prompt-tokens 512 cannot fit")
