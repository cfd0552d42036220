"""`sparkcluster bench --url` against tests/support/openai_stub.py on 127.0.0.1, a server whose timing is exactly known
(first token after TTFT, then one token every ITL, no batching effects): every figure within 5% of the truth;
token counts are the server's usage; failures and Ctrl-C still print the rows measured so far."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.helpers import run_cli
from tests.support.openai_stub import running_stub
from tests.support.bench import _sigint_as_a_terminal_sends_it, _stub_requests

ROW_KEYS = {"concurrency", "prefill_tps", "generation_tps", "peak_tps", "ttft_s", "itl_s", "e2e_s", "requests",
            "prompt_tokens", "completion_tokens", "errors"}
TTFT, ITL, OUTPUT, PROMPT, PER_STREAM = 0.2, 0.02, 50, 64, 3


def bench(url: str, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_cli("bench", "--url", url, "--json", "--runs", "1", "--requests-per-stream", str(PER_STREAM),
                   "--output-tokens", str(OUTPUT), "--prompt-tokens", str(PROMPT), *flags, timeout=timeout)


def within(measured: float, truth: float, tolerance: float = 0.05) -> bool:
    return abs(measured - truth) <= tolerance * truth


@pytest.mark.serial  # a clock measured to a few percent: alone on the cores
def test_bench_measures_a_server_of_known_timing_within_5_percent(tmp_path):
    with running_stub(ttft=TTFT, itl=ITL) as url:
        result = bench(url, "--concurrency", "1,4", "--csv", str(tmp_path / "b.csv"), "--plot",
                       str(tmp_path / "b.png"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["config"]["endpoint"] == url and doc["config"]["model"] == "stub-model"
    assert doc["config"]["method"]["prompt_tokens_measured"] == PROMPT  # learnt from the server's usage
    e2e = TTFT + (OUTPUT - 1) * ITL  # 1.18 s per request
    for row, c in zip(doc["rows"], (1, 4)):
        assert set(row) == ROW_KEYS and row["concurrency"] == c
        assert (row["requests"], row["errors"]) == (c * PER_STREAM, 0)
        assert row["completion_tokens"] == c * PER_STREAM * OUTPUT  # the server's usage, every request
        assert row["prompt_tokens"] == c * PER_STREAM * PROMPT
        assert within(row["ttft_s"]["p50"], TTFT) and within(row["ttft_s"]["mean"], TTFT)
        assert within(row["itl_s"]["p50"], ITL) and within(row["itl_s"]["mean"], ITL)
        assert within(row["e2e_s"]["p50"], e2e) and within(row["e2e_s"]["mean"], e2e)
        # The tail picks up this shared machine's scheduling jitter (tens of ms), not the client's error.
        assert within(row["ttft_s"]["p99"], TTFT, 0.25) and within(row["e2e_s"]["p99"], e2e, 0.1)
        # Streams that start together stay together: c prompts ingested in each TTFT.
        assert within(row["prefill_tps"], c * PROMPT / TTFT)
        assert within(row["generation_tps"], c * OUTPUT / e2e)
        # A request's 50 tokens arrive within 0.98 s, and the stream's next one 0.2 s after its end.
        assert within(row["peak_tps"], c * OUTPUT)
    server = doc["server"][1]
    assert server["generation_tokens"] == 4 * PER_STREAM * OUTPUT and server["preemptions"] == 0
    assert (tmp_path / "b.csv").read_text().count("\n") == 3
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_a_server_that_refuses_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    result = run_cli("bench", "--url", f"127.0.0.1:{port}", "--concurrency", "1", timeout=60)
    assert result.returncode == 1
    err = " ".join(result.stderr.split())
    assert f"nothing answers at http://127.0.0.1:{port}/v1/models" in err and "fix:" in err


def test_errors_mid_run_exit_1_with_the_rows_so_far():
    # One calibration probe, one warm-up, c=1's 3 requests; then every request fails.
    with running_stub(ttft=0.01, itl=0.001, fail_after=5) as url:
        result = bench(url, "--concurrency", "1,2")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert [r["concurrency"] for r in doc["rows"]] == [1, 2]
    assert doc["rows"][0]["errors"] == 0 and doc["rows"][1]["errors"] >= 1
    assert "HTTP 500" in doc["error"]["message"] and "at concurrency 2" in doc["error"]["message"]


def test_bad_flags_fail_before_any_request():
    result = run_cli("bench", "--url", "http://127.0.0.1:9/v1", "--concurrency", "1,zero", timeout=60)
    assert result.returncode == 2 and "--concurrency" in result.stderr
    result = run_cli("bench", "--url", "http://127.0.0.1:9/v1", "--compare", "default", timeout=60)
    assert result.returncode == 2 and "no published reference rows" in " ".join(result.stderr.split())
    # A flag of the other method would be silently ignored.
    result = run_cli("bench", "--url", "http://127.0.0.1:9/v1", "--method", "llama-benchy", "--prompt-tokens", "64",
                     timeout=60)
    assert result.returncode == 2 and "--prompt-tokens: not a flag of --method llama-benchy" in result.stderr
    result = run_cli("bench", "--url", "http://127.0.0.1:9/v1", "--depth", "0", "128", timeout=60)
    assert result.returncode == 2 and "--depth: not a flag of --method sustained" in result.stderr


def test_ctrl_c_prints_the_partial_table_and_exits_130():
    # c=1 completes; c=2's requests are accepted and never answered, until Ctrl-C.
    with running_stub(ttft=0.01, itl=0.001, stall_after=5) as url:
        process = subprocess.Popen([sys.executable, "-m", "sparkcluster", "bench", "--url", url, "--runs", "1",
                                    "--requests-per-stream", "3", "--output-tokens", "5", "--prompt-tokens", "16",
                                    "--concurrency", "1,2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=_sigint_as_a_terminal_sends_it)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)
            if _stub_requests(url) >= 7:  # probe, warm-up, c=1's 3, then c=2's 2 stalled ones
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "interrupted: 1 of 2 concurrencies measured" in err
    assert "stub-model" in out and "\n  1 " in out


