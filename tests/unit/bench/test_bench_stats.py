"""bench's arithmetic on synthetic timelines with known TTFT, ITL and windows: exact expected values. Also the
pure pieces around it: prompt-length calibration, /metrics parsing, reference rows and their ratios, the row keys."""

from __future__ import annotations

import io

import pytest

from sparkcluster.bench import metrics
from sparkcluster.bench.methods.closed_loop import prompts, table
from sparkcluster.bench.methods.closed_loop import reference as compare
from sparkcluster.bench.methods.closed_loop.arithmetic import (
    Distribution,
    Row,
    combine,
    distribution,
    peak_rate,
    percentile,
    summarize_run,
    union_length,
)
from sparkcluster.bench.methods.closed_loop.sweep import Level
from sparkcluster.bench.timeline import RequestTimeline, RunTimeline
from sparkcluster.engine.errors import UsageError
from sparkcluster.recipes.load import load_recipe

ROW_KEYS = {"concurrency", "prefill_tps", "generation_tps", "peak_tps", "ttft_s", "itl_s", "e2e_s", "requests",
            "prompt_tokens", "completion_tokens", "errors"}


def request(start: float, ttft: float, itl: float, tokens: int, prompt: int = 100) -> RequestTimeline:
    """A request whose first token came `ttft` after `start` and every next one `itl` later (one per chunk)."""
    times = tuple(start + ttft + i * itl for i in range(tokens))
    return RequestTimeline(start, times[-1], times, prompt, tokens)


def test_percentiles_interpolate_between_ranks_like_numpy():
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([7], 99) == 7
    assert distribution([1, 2, 3, 4]) == Distribution(2.5, 2.5, pytest.approx(3.7), pytest.approx(3.97))
    assert distribution([]) == Distribution(None, None, None, None)


def test_union_counts_overlaps_once():
    assert union_length([(0, 1), (0.5, 2), (3, 4)]) == 3.0
    assert union_length([(0, 4), (1, 2)]) == 4.0
    assert union_length([]) == 0.0


def test_peak_is_the_best_half_open_second():
    events = [(0.0, 1), (0.5, 1), (0.99, 1), (1.0, 1)]  # [0, 1) holds 3: the token at 1.0 is the next window's
    assert peak_rate(events) == 3.0
    assert peak_rate(events + [(1.2, 1)]) == 4.0  # [0.5, 1.5)
    assert peak_rate([(0.0, 2.5), (0.4, 2.5)]) == 5.0  # chunks that carried several tokens each


def test_one_request_ttft_itl_e2e():
    r = request(10.0, ttft=0.2, itl=0.05, tokens=5)
    assert r.ttft == pytest.approx(0.2)
    assert r.itl == pytest.approx(0.05)
    assert r.e2e == pytest.approx(0.4)


def test_itl_uses_the_servers_token_count_not_the_chunks():
    # Two chunks carried ten tokens (a server that batches its stream): 9 gaps between 10 tokens in 0.9 s.
    r = RequestTimeline(0.0, 1.5, (0.6, 1.5), prompt_tokens=50, completion_tokens=10)
    assert r.itl == pytest.approx(0.1)
    assert r.output_events() == [(0.6, 5.0), (1.5, 5.0)]
    assert RequestTimeline(0.0, 1.0, (0.5,), 50, 1).itl is None


def test_one_stream_two_requests():
    a = request(0.0, ttft=1.0, itl=0.1, tokens=10)  # tokens 1.0 .. 1.9
    b = request(a.end, ttft=1.0, itl=0.1, tokens=10)  # sent at 1.9, tokens 2.9 .. 3.8
    row = summarize_run(RunTimeline(1, (a, b), (0.0, b.end)))
    assert row.prefill_tps == pytest.approx(200 / 2.0)  # two 1 s prefills
    assert row.generation_tps == pytest.approx(20 / 3.8)
    assert row.peak_tps == 10.0  # [1.0, 2.0) holds a's ten tokens
    assert row.ttft_s.mean == pytest.approx(1.0) and row.ttft_s.p99 == pytest.approx(1.0)
    assert row.itl_s.p50 == pytest.approx(0.1)
    assert row.e2e_s.mean == pytest.approx(1.9)
    assert (row.requests, row.prompt_tokens, row.completion_tokens, row.errors) == (2, 200, 20, 0)


def test_overlapping_prefills_are_not_added():
    a = request(0.0, ttft=0.5, itl=0.1, tokens=2)
    b = request(0.0, ttft=1.0, itl=0.1, tokens=2)
    row = summarize_run(RunTimeline(2, (a, b), (0.0, 1.1)))
    assert row.prefill_tps == pytest.approx(200 / 1.0)  # both prompts ingested within [0, 1.0]
    assert row.ttft_s.mean == pytest.approx(0.75) and row.ttft_s.p50 == pytest.approx(0.75)


def test_throughput_counts_only_the_window_when_all_streams_were_busy():
    short = request(0.0, ttft=0.5, itl=0.5, tokens=4)  # tokens 0.5 1.0 1.5 2.0; its stream then ran dry
    long = request(0.0, ttft=0.5, itl=1.0, tokens=4)  # tokens 0.5 1.5 2.5 3.5
    row = summarize_run(RunTimeline(2, (short, long), (0.0, 2.0)))
    assert row.generation_tps == pytest.approx(6 / 2.0)  # 2.5 and 3.5 fall in the tail
    assert row.peak_tps == 3.0  # [0.5, 1.5): 0.5 0.5 1.0; [1.0, 2.0): 1.0 1.5 1.5; [1.5, 2.5): 1.5 1.5 2.0
    assert row.completion_tokens == 8  # the counts are every token the server reported


def test_a_window_shorter_than_a_second_reports_the_mean_as_peak():
    r = request(0.0, ttft=0.1, itl=0.1, tokens=5)
    row = summarize_run(RunTimeline(1, (r,), (0.0, 0.5)))
    assert row.peak_tps == row.generation_tps == pytest.approx(5 / 0.5)


def test_failed_requests_count_as_errors_and_add_no_tokens():
    ok = request(0.0, ttft=0.5, itl=0.1, tokens=5)
    failed = RequestTimeline(0.0, 0.2, error="HTTP 500: boom")
    row = summarize_run(RunTimeline(2, (ok, failed), (0.0, 0.2)))
    assert (row.requests, row.errors, row.completion_tokens, row.prompt_tokens) == (2, 1, 5, 100)
    assert row.ttft_s.mean == pytest.approx(0.5)


def _row(c: int, gen: float, ttft: float | None, requests: int) -> Row:
    d = Distribution(ttft, ttft, ttft, ttft)
    return Row(c, gen * 10, gen, gen * 2, d, d, d, requests, requests * 100, requests * 8, 0)


def test_a_concurrency_is_the_median_of_its_runs_with_total_counts():
    row = combine([_row(4, 100, 0.3, 16), _row(4, 90, 0.1, 16), _row(4, 120, None, 16)])
    assert (row.generation_tps, row.prefill_tps, row.peak_tps) == (100, 1000, 200)
    assert row.ttft_s.p50 == pytest.approx(0.2)  # the median of the runs that had a value
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (48, 4800, 384)
    assert set(row.to_json()) == ROW_KEYS
    assert set(row.to_json()["ttft_s"]) == {"mean", "p50", "p90", "p99"}


def test_prompt_length_calibration_converges_on_any_ratio():
    tokens_of = lambda words: round(1.3 * words) + 1  # noqa: E731 (a tokenizer: 1.3 tokens per word, plus BOS)
    samples = [(100, tokens_of(100))]
    assert prompts.next_guess(100, samples) == 76  # 100 * 100 / 131
    samples.append((76, tokens_of(76)))
    assert prompts.close_enough(100, samples[-1][1])
    assert prompts.next_guess(120, samples) == 91  # the secant through (100, 131) and (76, 100)
    assert prompts.prompt(5, 1) == prompts.prompt(5, 1) != prompts.prompt(5, 2)
    # Unique prompts differ from their first words on, so no prefix (cache block) is shared.
    assert len({tuple(prompts.prompt(8, seed).split()[:3]) for seed in range(50)}) == 50


METRICS = """# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 30.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="m"} 24.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 5000.0
"""


def test_metrics_are_summed_over_label_sets_and_taken_as_deltas():
    first = metrics.parse(METRICS)
    assert first["vllm:generation_tokens_total"] == 1024.0 and first["vllm:kv_cache_usage_perc"] == 0.25
    last = {**first, "vllm:prefix_cache_hits_total": 80.0, "vllm:prefix_cache_queries_total": 200.0,
            "vllm:generation_tokens_total": 1536.0, "vllm:kv_cache_usage_perc": 0.5}
    busy = {**first, "vllm:kv_cache_usage_perc": 0.75}
    server = metrics.summarize([(first, last, [first, busy, last])])
    assert server == metrics.ServerSide(0.75, 0.5, 0, 512, 0)
    assert metrics.summarize([({}, {}, [])]) is None  # not vLLM: no figures, not zeros


def test_bundled_reference_rows_and_ratios():
    reference = load_recipe("gpt-oss-120b").reference
    assert reference is not None and reference.nodes == 1 and len(reference.rows) == 11
    assert reference.rows[0] == {"concurrency": 1, "prefill_tps": 5115.0, "generation_tps": 60.4, "peak_tps": 60.4}
    measured = Row(1, 2557.5, 30.2, 60.4, *(Distribution(0.1, 0.1, 0.1, 0.1),) * 3, 4, 400, 32, 0)
    found = {r.figure: r.ratio for r in compare.ratios([measured, _row(3, 1, 1, 1)], reference)}
    assert found == {"prefill_tps": 0.5, "generation_tps": 0.5, "peak_tps": 1.0}  # c=3 is not published


@pytest.mark.parametrize("reference, message", [
    ("reference: [1]\n", "recipe.yml:2: reference needs exactly hardware, nodes, rows, source"),
    ("reference:\n  source: s\n  hardware: h\n  nodes: 0\n  rows: [{concurrency: 1}]\n",
     "recipe.yml:5: reference nodes 0 is not a count"),
    ("reference:\n  source: s\n  hardware: h\n  nodes: 1\n  rows:\n    - {concurrency: 1}\n    - {generation_tps: 3}\n",
     "recipe.yml:8: a reference row needs a concurrency"),
    ("reference:\n  source: s\n  hardware: h\n  nodes: 1\n  rows:\n    - {concurrency: 1, gen_tps: 3}\n",
     "recipe.yml:7: unknown figure 'gen_tps'"),
    ("reference:\n  source: s\n  hardware: h\n  nodes: 1\n  rows:\n    - {concurrency: 1, peak_tps: fast}\n",
     "recipe.yml:7: peak_tps 'fast' is not a non-negative number"),
])
def test_a_bad_reference_is_refused_at_its_line(tmp_path, reference, message):
    path = tmp_path / "recipe.yml"
    path.write_text("model: org/name\n" + reference)
    with pytest.raises(UsageError) as e:
        load_recipe(str(path))
    assert message in e.value.message and e.value.exit_code == 2


def test_csv_flattens_the_distributions():
    level = Level(_row(2, 50, 0.2, 8), None)
    out = io.StringIO()
    table.write_csv([level], out)
    header, line = out.getvalue().splitlines()
    assert header.split(",")[:6] == ["concurrency", "prefill_tps", "generation_tps", "peak_tps", "ttft_s_mean",
                                     "ttft_s_p50"]
    assert "server_kv_cache_peak" in header and line.startswith("2,500,50,100,0.2,")
