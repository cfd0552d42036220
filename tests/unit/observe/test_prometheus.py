"""The Prometheus text reader `top` and `bench` share, and the endpoint figures `top` and `status` show: on two
real /metrics captures of the CPU vLLM 0.32 under load (tests/fixtures/metrics, taken 0.5 s apart, the model path
label renamed), on hand-made edge cases, and under a fuzz test: a value or a clean error, never an exception."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkcluster.bench import metrics
from sparkcluster.observe.prometheus import Histogram, parse
from sparkcluster.observe.scrape import Reading, figures, metrics_url

FIXTURES = Path(__file__).parents[2] / "fixtures" / "metrics"
BUSY = (FIXTURES / "vllm-0.32-cpu-busy.txt").read_text()
BUSY_LATER = (FIXTURES / "vllm-0.32-cpu-busy2.txt").read_text()


def test_a_real_vllm_scrape_reads_whole():
    scrape = parse(BUSY)
    assert scrape.skipped == 0 and not scrape.truncated
    assert scrape.total("vllm:num_requests_running") == 8
    assert scrape.total("vllm:generation_tokens_total") == 963
    ttft = scrape.histogram("vllm:time_to_first_token_seconds")
    assert ttft is not None and ttft.count == 14 and ttft.buckets[-1] == (math.inf, 14)
    assert math.isclose(ttft.sum, 0.40538620948791504)


def test_figures_over_an_interval_of_two_real_scrapes():
    before = Reading(100.0, parse(BUSY))
    got = figures(parse(BUSY_LATER), before, 100.5)
    assert got.running == 8 and got.waiting == 0
    assert got.kv_cache_usage is not None and math.isclose(got.kv_cache_usage, 0.003907203907203893)
    assert got.generation_tokens_per_s is not None and math.isclose(got.generation_tokens_per_s, (1675 - 963) / 0.5)
    assert got.prompt_tokens_per_s == 0  # every prompt was in before the first scrape
    # ITL over the interval: 632 of 712 new observations <= 10 ms, all <= 25 ms (linear within a bucket).
    assert got.itl_p50_s is not None and math.isclose(got.itl_p50_s, 0.01 * 356 / 632)
    assert got.itl_p90_s is not None and math.isclose(got.itl_p90_s, 0.01 + 0.015 * (0.9 * 712 - 632) / 80)
    # No first token in the interval: TTFT is the lifetime figure, and says so.
    assert got.since_start and got.ttft_p50_s is not None and math.isclose(got.ttft_p50_s, 0.02 + 0.02 * 5 / 9)
    assert got.prefix_cache_hit_rate == 0.0 and got.preemptions == 0 and got.interval_s == 0.5
    assert "running 8, waiting 0" in got.summary() and "generation 1424.0 tok/s" in got.summary()


def test_one_scrape_gives_gauges_and_lifetime_quantiles_but_no_rates():
    got = figures(parse(BUSY))
    assert got.running == 8 and got.generation_tokens_per_s is None and got.interval_s is None
    assert got.ttft_p90_s is not None and math.isclose(got.ttft_p90_s, 0.04 + 0.02 * 1.6 / 3)


def test_a_server_restart_between_scrapes_gives_no_negative_rate():
    got = figures(parse(BUSY), Reading(0.0, parse(BUSY_LATER)), 1.0)
    assert got.generation_tokens_per_s is None and got.itl_p50_s is not None and got.itl_p50_s > 0


@pytest.mark.parametrize("text", [
    'vllm:num_requests_running{engine="0"} NaN\nvllm:generation_tokens_total 5\n',
    'vllm:num_requests_running{engine="0"} +Inf\nvllm:generation_tokens_total -Inf\n',
    "vllm:kv_cache_usage_perc NaN\nvllm:prefix_cache_hits_total +Inf\nvllm:prefix_cache_queries_total +Inf\n",
])
def test_nan_and_inf_never_reach_a_figure_or_an_integer(text):
    scrape = parse(text)
    assert all(math.isfinite(v) for v in scrape.totals().values())
    got = figures(scrape, Reading(0.0, parse(text)), 1.0)
    assert got.running in (None, 0) or math.isfinite(got.running)
    # bench's summary rounds counter deltas: round(NaN) was the round-3 traceback.
    sample = metrics.parse(text)
    assert metrics.summarize([(sample, sample, [sample])]) is not None or sample == {}


def test_malformed_lines_are_skipped_and_counted_not_fatal():
    text = ('vllm:num_requests_running{engine="0"} 3\n'
            'garbage line with words\n'
            'vllm:x{le="unterminated} 1\n'
            'vllm:y{a="b"}2\n'
            '{only="labels"} 4\n'
            'vllm:num_requests_waiting{engine="0",q="a \\"quoted\\" \\\\ value"} 2 1712345678000\n')
    scrape = parse(text)
    assert scrape.total("vllm:num_requests_running") == 3 and scrape.total("vllm:num_requests_waiting") == 2
    assert scrape.skipped == 4
    assert dict(scrape.samples[-1].labels)["q"] == 'a "quoted" \\ value'


def test_histogram_quantiles():
    h = Histogram(((0.1, 0.0), (0.2, 10.0), (math.inf, 10.0)), 10.0)
    assert h.quantile(0.5) == pytest.approx(0.15)
    beyond = Histogram(((0.1, 0.0), (math.inf, 10.0)), 10.0)
    assert beyond.quantile(0.9) == 0.1  # in +Inf: the highest finite bound, as Prometheus does
    assert Histogram((), 0.0).quantile(0.5) is None
    assert Histogram(((1.0, 0.0), (math.inf, 0.0)), 0.0).quantile(0.5) is None


def test_metrics_url_from_an_endpoint():
    assert metrics_url("http://10.0.0.1:8000/v1") == "http://10.0.0.1:8000/metrics"
    assert metrics_url("http://10.0.0.1:8000/") == "http://10.0.0.1:8000/metrics"


# ---- fuzz: "a value or a clean error, never an exception" ---------------------------------------------------
NAMES = st.sampled_from(["vllm:num_requests_running", "vllm:generation_tokens_total", "vllm:kv_cache_usage_perc",
                         "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
                         "vllm:inter_token_latency_seconds_bucket", "vllm:prefix_cache_hits_total",
                         "vllm:prefix_cache_queries_total", "x", "9bad", ""])
VALUES = st.one_of(st.sampled_from(["NaN", "+Inf", "-Inf", "nan", "inf", "1e309", "-0", "0x10", "", "1_0", "--1"]),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers().map(str),
                   st.text(max_size=8))
LABEL_VALUES = st.one_of(st.sampled_from(["+Inf", "NaN", "0.1", "abc", "-1"]), st.text(max_size=6))
LABELS = st.one_of(st.just(""), st.lists(st.tuples(st.sampled_from(["le", "engine", "model_name", "1x", ""]),
                                                   LABEL_VALUES), max_size=3).map(
    lambda pairs: "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"), st.text(max_size=10))
LINES = st.one_of(st.builds(lambda n, lab, v, sep: f"{n}{lab}{sep}{v}", NAMES, LABELS, VALUES,
                            st.sampled_from([" ", "\t", "", "  "])),
                  st.sampled_from(["# HELP x y", "# TYPE x histogram", "", "}", "{", '"']), st.text(max_size=40))


@settings(max_examples=300, deadline=None)
@given(st.lists(LINES, max_size=30), st.lists(LINES, max_size=30), st.floats(min_value=-5, max_value=5))
def test_fuzz_the_reader_figures_and_bench_summary_never_raise(first, second, seconds):
    a, b = parse("\n".join(first)), parse("\n".join(second))
    got = figures(b, Reading(0.0, a), seconds)
    for value in (got.running, got.generation_tokens_per_s, got.ttft_p50_s, got.itl_p90_s, got.prefix_cache_hit_rate):
        assert value is None or isinstance(value, float)
    got.summary()
    x, y = metrics.parse("\n".join(first)), metrics.parse("\n".join(second))
    metrics.summarize([(x, y, [x, y])])


def test_bench_samples_every_replica_behind_a_router_and_merges_them():
    # Failed before: the sampler read the router's /metrics, which vllm-router hands to one replica in turn, so a
    # run's first and last samples could be two engines' counters.
    import asyncio

    import aiohttp

    from tests.support.metrics import CAPTURES, busier, metrics_server

    kv = 'vllm:kv_cache_usage_perc{engine="0",model_name="local/tiny-llama"} 0.0019536019536019467'
    fuller = [busier(c).replace(kv, kv.split("} ")[0] + "} 0.5") for c in CAPTURES]

    async def sample(urls: list[str]) -> dict[str, float]:
        async with aiohttp.ClientSession() as client:
            return await metrics.Sampler(client, urls).read()

    with metrics_server(CAPTURES[:1]) as (one, _), metrics_server(fuller[:1]) as (two, _):
        alone, both = asyncio.run(sample([one])), asyncio.run(sample([one, two]))
        with metrics_server(CAPTURES[:1]) as (gone, server):
            server.shutdown()
            server.server_close()
            partial = asyncio.run(sample([one, gone]))
    assert both["vllm:num_requests_running"] == alone["vllm:num_requests_running"] + 3
    assert both["vllm:generation_tokens_total"] == 2 * alone["vllm:generation_tokens_total"]
    assert both["vllm:kv_cache_usage_perc"] == 0.5  # the fullest engine's cache, not a sum
    assert partial == {}  # one engine silent: no sample, so no delta spans another set of engines
