"""`sparkcluster bench --method llama-benchy` as a user runs it, against tests/support/openai_stub.py: a chat server whose
timing is exactly known (first token after ttft + prompt tokens / prefill_tps, then one every itl; a prompt's
tokens are its words). Every figure lands within 5% of the truth; failures, stalls and bad flags end cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.helpers import run_cli
from tests.support.openai_stub import running_stub
from tests.support.bench import benchy

TTFT, ITL, PREFILL, PP, TG, DEPTH = 0.1, 0.01, 20000.0, 256, 32, 1024


def within(measured: float, truth: float, tolerance: float = 0.05) -> bool:
    return abs(measured - truth) <= tolerance * truth


def entry(doc: dict, depth: int, concurrency: int, context_phase: bool) -> dict:
    return next(b for b in doc["benchmarks"] if (b["context_size"], b["concurrency"], b["is_context_prefill_phase"])
                == (depth, concurrency, context_phase))


@pytest.mark.serial  # a clock measured to a few percent: alone on the cores
def test_a_server_of_known_timing_is_measured_within_5_percent(tmp_path):
    with running_stub(ttft=TTFT, itl=ITL, prefill_tps=PREFILL) as url:
        result = benchy(tmp_path, url, "--pp", str(PP), "--tg", str(TG), "--depth", "0", str(DEPTH),
                        "--concurrency", "1,2", "--runs", "2", "--enable-prefix-caching", "--json",
                        "--csv", str(tmp_path / "b.csv"), "--plot", str(tmp_path / "b.png"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert list(doc)[:8] == ["version", "timestamp", "latency_mode", "latency_ms", "model", "prefix_caching_enabled",
                             "max_concurrency", "benchmarks"] and list(doc)[8:] == ["sparkcluster"]
    assert (doc["model"], doc["max_concurrency"], doc["prefix_caching_enabled"]) == ("stub-model", 2, True)
    assert doc["sparkcluster"]["coherence_answer"] == "Paris."
    latency = doc["latency_ms"] / 1000
    assert 0 < latency < 0.05
    # (words the server counts, the prompt llama-benchy divides by) for each kind of entry
    shapes = {(0, False): (PP, PP), (DEPTH, True): (DEPTH + 1, DEPTH + 1), (DEPTH, False): (DEPTH + PP, PP)}
    for (depth, context_phase), (server_words, counted) in shapes.items():
        ttfr = TTFT + server_words / PREFILL
        for c in (1, 2):
            e = entry(doc, depth, c, context_phase)
            assert len(e["ttfr"]["values"]) == 2 * c  # one per request of every run
            assert within(e["ttfr"]["mean"], ttfr * 1000) and within(e["e2e_ttft"]["mean"], ttfr * 1000)
            assert within(e["est_ppt"]["mean"], (ttfr - latency) * 1000)
            assert within(e["pp_req_throughput"]["mean"], counted / (ttfr - latency))
            # A burst starts together: c prompts from the first start to the last first token.
            assert within(e["pp_throughput"]["mean"], c * counted / (ttfr if c > 1 else ttfr - latency))
            assert within(e["tg_req_throughput"]["mean"], 1 / ITL)
            assert within(e["tg_throughput"]["mean"], c / ITL)
            # 32 tokens span 0.31 s, under the 1 s window: count / span.
            assert within(e["peak_req_throughput"]["mean"], TG / ((TG - 1) * ITL))
            assert within(e["peak_throughput"]["mean"], c * TG / ((TG - 1) * ITL))
    lines = (tmp_path / "b.csv").read_text().splitlines()
    assert lines[0].startswith("model,test_name,t_s_mean,t_s_std") and len(lines) == 1 + 12
    assert lines[-1].startswith("stub-model,tg32 @ d1024 (c2),")
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_the_markdown_table_is_printed_and_latency_mode_none_subtracts_nothing(tmp_path):
    with running_stub(ttft=0.05, itl=0.005, prefill_tps=PREFILL) as url:
        result = benchy(tmp_path, url, "--pp", "64", "--tg", "8", "--runs", "1", "--latency-mode", "none",
                        "--no-warmup")
    assert result.returncode == 0, result.stderr
    table = result.stdout.splitlines()
    assert [h.strip() for h in table[0].split("|")[1:-1]] == ["model", "test", "t/s", "peak t/s", "ttfr (ms)",
                                                              "est_ppt (ms)", "e2e_ttft (ms)"]
    assert [row.split("|")[2].strip() for row in table[2:]] == ["pp64", "tg8"]
    ttfr, est_ppt = (float(table[2].split("|")[i].split("±")[0]) for i in (5, 6))
    # Nothing subtracted: est_ppt is the time to the first response itself, which the stub holds back for at least
    # its ttft plus the prefill. A lower bound, not a band: on a busy machine the same run takes a little longer.
    assert ttfr == est_ppt and ttfr >= (0.05 + 64 / PREFILL) * 1000


def test_an_incoherent_model_stops_the_run_with_its_answer(tmp_path):
    with running_stub(ttft=0.01, itl=0.001, answer="London, obviously.") as url:
        result = benchy(tmp_path, url, "--pp", "32", "--tg", "4", "--json")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["benchmarks"] == [] and "London, obviously." in doc["sparkcluster"]["error"]["message"]
    assert "coherence" in doc["sparkcluster"]["error"]["message"]


def test_failures_mid_run_exit_1_with_the_cells_so_far(tmp_path):
    # Session start: 3 prompt probes + the coherence question; cell c=1: a warm-up and 1 run; then HTTP 500s.
    with running_stub(ttft=0.01, itl=0.001, fail_after=6) as url:
        result = benchy(tmp_path, url, "--pp", "32", "--tg", "4", "--concurrency", "1", "2", "--runs", "1",
                        "--json")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert [b["concurrency"] for b in doc["benchmarks"]] == [1, 2]
    assert len(doc["benchmarks"][0]["ttfr"]["values"]) == 1 and doc["benchmarks"][1]["ttfr"] is None
    assert doc["sparkcluster"]["cells_measured"] == 1
    assert "HTTP 500" in doc["sparkcluster"]["error"]["message"]


def test_a_server_that_stalls_is_bounded_by_the_timeout(tmp_path):
    with running_stub(ttft=0.01, itl=0.001, stall_after=6) as url:
        result = benchy(tmp_path, url, "--pp", "32", "--tg", "4", "--concurrency", "1", "2", "--runs", "1",
                        "--timeout", "2", timeout=60)
    assert result.returncode == 1
    assert "pp32 (c1)" in result.stdout  # the finished cell's rows
    assert "longer than --timeout 2 s" in " ".join(result.stderr.split())


@pytest.mark.parametrize("flags, problem", [
    (["--pp", "512", "x"], "--pp"),
    (["--depth", "-1"], "--depth"),
    (["--concurrency", "0"], "--concurrency"),
    (["--profile", "arena-v9", "--out", "d"], "no such built-in profile"),
    (["--profile", "arena-v2"], "--profile needs --out"),
    (["--out", "d"], "--out is for --profile"),
    (["--corpus", "/nonexistent/book.txt"], "--corpus"),
    (["--tokenizer", "/nonexistent"], "--tokenizer"),
])
def test_bad_flags_are_exit_2_before_any_request(tmp_path, flags, problem):
    result = benchy(tmp_path, "http://127.0.0.1:9/v1", *flags, timeout=60)
    assert result.returncode == 2, result.stderr
    assert problem in " ".join(result.stderr.split())


def published_csv(path: Path, *rows: tuple[str, float]) -> Path:
    """A results file in llama-benchy's CSV shape, with our own figures."""
    header = ("model,test_name,t_s_mean,t_s_std,t_s_req_mean,t_s_req_std,peak_ts_mean,peak_ts_std,peak_ts_req_mean,"
              "peak_ts_req_std,ttfr_mean,ttfr_std,est_ppt_mean,est_ppt_std,e2e_ttft_mean,e2e_ttft_std")
    path.write_text("\n".join([header, *(f"m,{name},{value},0,{value},0,,,,,100.0,0,99.0,0,100.0,0"
                                         for name, value in rows)]) + "\n")
    return path


def test_compare_puts_rows_of_the_same_shape_beside_a_llama_benchy_csv(tmp_path):
    reference = published_csv(tmp_path / "theirs.csv", ("pp64 (c2)", 1000.0), ("pp64 @ d512 (c9)", 5.0))
    with running_stub(ttft=0.05, itl=0.005, prefill_tps=PREFILL) as url:
        result = benchy(tmp_path, url, "--pp", "64", "--tg", "8", "--concurrency", "1", "2", "--runs", "1",
                        "--compare", str(reference), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    compared = doc["sparkcluster"]["compare"]["ratios"]
    assert {(r["test"], r["figure"]) for r in compared} == {("pp64 (c2)", f) for f in ("t_s", "ttfr", "est_ppt",
                                                                                         "e2e_ttft")}
    t_s = next(r for r in compared if r["figure"] == "t_s")
    measured = next(b for b in doc["benchmarks"] if b["concurrency"] == 2)["pp_throughput"]["mean"]
    assert t_s["measured"] == measured and t_s["ratio"] == measured / 1000.0


@pytest.mark.parametrize("method, compare, problem", [
    ("llama-benchy", "theirs.csv", "none of its rows has a shape this run measures"),
    ("llama-benchy", "gpt-oss-120b", "by concurrency alone"),
    ("sustained", "theirs.csv", "not comparable with --method sustained"),
])
def test_compare_refuses_rows_of_another_method_or_shape(tmp_path, method, compare, problem):
    published_csv(tmp_path / "theirs.csv", ("pp2048 @ d4096 (c5)", 900.0), ("tg128 @ d4096 (c5)", 30.0))
    argument = str(tmp_path / compare) if compare.endswith(".csv") else compare
    shape = ("--pp", "64") if method == "llama-benchy" else ()
    result = run_cli("bench", "--url", "http://127.0.0.1:9/v1", "--method", method, *shape,
                     "--compare", argument, timeout=60)
    assert result.returncode == 2, result.stderr
    text = " ".join(result.stderr.split())
    assert problem in text
    if "shape" in problem:  # the fix names the published shapes to measure
        assert "--pp 2048 --tg 128 --depth 4096 --concurrency 5" in text


def test_the_token_tally_matches_the_servers_own_counters(tmp_path):
    import urllib.request

    with running_stub(ttft=0.01, itl=0.001, prefill_tps=PREFILL) as url:
        result = benchy(tmp_path, url, "--pp", "64", "--tg", "8", "--depth", "0", "128", "--concurrency", "1", "2",
                        "--runs", "1", "--enable-prefix-caching", "--json")
        with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=5) as response:
            metrics = dict(line.rsplit(" ", 1) for line in response.read().decode().splitlines()
                           if line and not line.startswith("#"))
    assert result.returncode == 0, result.stderr
    tokens = json.loads(result.stdout)["sparkcluster"]["tokens"]
    assert tokens["requests"] == int(metrics["stub:requests_total"])
    assert tokens["prompt_tokens"] == float(metrics['vllm:prompt_tokens_total{model_name="stub-model"}'])
    assert tokens["completion_tokens"] == tokens["counted_tokens"] == float(
        metrics['vllm:generation_tokens_total{model_name="stub-model"}'])


@pytest.mark.serial  # a clock measured to a few percent: alone on the cores
def test_latency_mode_generation_is_the_first_byte_of_a_one_token_request(tmp_path):
    # The probe's prompt ("hello") is 1 token: its first byte after 50 + 1 ms; a 64-token prompt's after 114 ms.
    with running_stub(ttft=0.05, itl=0.005, prefill_tps=1000) as url:
        result = benchy(tmp_path, url, "--pp", "64", "--tg", "8", "--runs", "1", "--latency-mode", "generation",
                        "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    # Never before the stub's first token; a few ms after it (the round trip, more on a busy machine).
    assert doc["latency_mode"] == "generation" and 51 <= doc["latency_ms"] <= 61
    cell = doc["benchmarks"][0]
    assert within(cell["ttfr"]["mean"] - cell["est_ppt"]["mean"], doc["latency_ms"], 0.01)
