"""bench --method llama-benchy's parts on values whose answers are known by hand: llama-benchy 0.4.0's arithmetic
(per request, per burst, the 1 s peak window, mean and population std), its row names and its three formats,
prompts of exactly the requested token counts, the tokenizer search, and the Arena v2 profile."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
import tokenizers  # a required dependency (pyproject.toml): never skipped

from sparkcluster.bench.methods.llama_benchy.corpus import Corpus, WordTokenizer, find_tokenizer
from sparkcluster.bench.methods.llama_benchy import formats as benchy_report
from sparkcluster.bench.methods.llama_benchy.arithmetic import BenchmarkRun, metric, peak_throughput, summarize
from sparkcluster.bench.methods.llama_benchy.chat import RequestResult, finalize
from sparkcluster.bench.methods.llama_benchy.profile import ARENA_V2, ARENA_V2_DEPTHS, load_profile
from sparkcluster.bench.timeline import Chunk
from sparkcluster.engine.errors import UsageError

BENCHMARK_KEYS = {"concurrency", "context_size", "prompt_size", "response_size", "is_context_prefill_phase",
                  "pp_throughput", "pp_req_throughput", "tg_throughput", "tg_req_throughput", "peak_throughput",
                  "peak_req_throughput", "ttfr", "est_ppt", "e2e_ttft", "throughput_over_time",
                  "requests_throughput_over_time"}


def request(start: float, ttfr: float, tokens: int, itl: float, prompt: int) -> RequestResult:
    """A request whose first chunk with choices and first token arrive `ttfr` after `start`, then one token
    every `itl`."""
    times = [start + ttfr + i * itl for i in range(tokens)]
    return RequestResult(start_ts=start, end_ts=times[-1] + 0.001, first_token_ts=times[0],
                         first_response_ts=times[0], prompt_tokens=prompt, total_tokens=tokens,
                         token_timestamps=times)


def test_one_request_per_run_gives_llama_benchys_per_request_figures():
    latency = 0.05
    runs = [[request(0.0, 0.5, 11, 0.1, 1000)], [request(10.0, 0.25, 11, 0.05, 1000)]]
    entry = summarize(runs, pp=1000, tg=11, depth=0, concurrency=1, latency=latency, expected_prompt=1000,
                      context_phase=False)
    pp = [1000 / 0.45, 1000 / 0.2]  # prompt / (ttfr - latency)
    tg = [10 / 1.0, 10 / 0.5]  # tokens after the first / (last - first)
    assert entry.pp_throughput.values == pytest.approx(pp)
    assert entry.pp_throughput.mean == pytest.approx(sum(pp) / 2)
    assert entry.pp_throughput.std == pytest.approx(abs(pp[0] - pp[1]) / 2)  # population std of two values
    assert entry.pp_req_throughput == entry.pp_throughput  # at c=1 the same figure
    assert entry.tg_throughput.values == pytest.approx(tg)
    assert entry.ttfr.values == pytest.approx([500, 250])  # ms
    assert entry.est_ppt.values == pytest.approx([450, 200])
    assert entry.e2e_ttft.values == pytest.approx([500, 250])
    # 11 tokens over 1.0 s: the 1 s window ending at the last holds the 10 after the first; 0.5 s: count / span.
    assert entry.peak_throughput.values == pytest.approx([10.0, 22.0])
    assert set(entry.to_json()) == BENCHMARK_KEYS


def test_a_burst_is_measured_from_the_first_start_to_the_last_first_token():
    # Binary fractions throughout, so the window's edges fall where the hand count puts them.
    burst = [request(0.0, 0.5, 17, 0.0625, 500), request(0.125, 0.5, 17, 0.0625, 500)]
    entry = summarize([burst], pp=500, tg=17, depth=0, concurrency=2, latency=0.0, expected_prompt=500,
                      context_phase=False)
    assert entry.pp_throughput.values == pytest.approx([1000 / 0.625])  # 2 prompts / (0.625 - 0.0)
    assert entry.pp_req_throughput.values == pytest.approx([1000.0, 1000.0])
    # 32 decoded tokens from the earliest first token (0.5) to the latest last token (1.625).
    assert entry.tg_throughput.values == pytest.approx([32 / 1.125])
    assert entry.tg_req_throughput.values == pytest.approx([16.0, 16.0])
    # Tokens 0.5..1.5 and 0.625..1.625 every 1/16 s: the best 1 s window, (0.5, 1.5], holds 16 + 15.
    assert entry.peak_throughput.values == pytest.approx([31.0])
    assert entry.peak_req_throughput.values == pytest.approx([16.0, 16.0])


def test_the_servers_prompt_count_is_used_only_within_20_percent():
    near = summarize([[request(0, 0.5, 3, 0.1, 1100)]], pp=1000, tg=3, depth=0, concurrency=1, latency=0,
                     expected_prompt=1000, context_phase=False)
    far = summarize([[request(0, 0.5, 3, 0.1, 5000)]], pp=1000, tg=3, depth=0, concurrency=1, latency=0,
                    expected_prompt=1000, context_phase=False)
    assert near.pp_throughput.mean == pytest.approx(2200)
    assert far.pp_throughput.mean == pytest.approx(2000)


def test_failed_requests_are_left_out_and_a_run_of_failures_adds_nothing():
    failed = RequestResult(start_ts=0, error="HTTP 500")
    entry = summarize([[failed], [request(0, 0.5, 3, 0.1, 100)]], pp=100, tg=3, depth=0, concurrency=1,
                      latency=0, expected_prompt=100, context_phase=False)
    assert len(entry.pp_throughput.values) == 1
    empty = summarize([[failed]], pp=100, tg=3, depth=0, concurrency=1, latency=0, expected_prompt=100,
                      context_phase=False)
    assert empty.pp_throughput is None and empty.to_json()["pp_throughput"] is None


def test_peak_window_edges():
    assert peak_throughput([]) == 0.0
    assert peak_throughput([5.0] * 4) == 4.0  # no span: the window count
    every_64th = [i / 64 for i in range(129)]  # 2 s of 64 tok/s (exact in binary, so the edges are exact)
    assert peak_throughput(every_64th) == pytest.approx(64.0)  # a window holds (end - 1, end]
    assert peak_throughput([0.0, 0.5]) == pytest.approx(4.0)  # 2 tokens in 0.5 s


def test_metric_is_mean_population_std_and_values():
    m = metric([1.0, 2.0, 3.0, 4.0], 1000)
    assert m.mean == 2500 and m.values == (1000, 2000, 3000, 4000)
    assert m.std == pytest.approx(1000 * math.sqrt(1.25))
    assert metric([]) is None


def test_token_times_come_from_token_ids_else_usage_else_chunks():
    with_ids = RequestResult(start_ts=0.0, first_token_ts=1.0)
    finalize(with_ids, [Chunk("a", 1.0, 1), Chunk("bc", 2.0, 2)], 99)
    assert with_ids.total_tokens == 3 and with_ids.token_timestamps == [1.0, 1.5, 2.0]
    from_usage = RequestResult(start_ts=0.0, first_token_ts=1.0)
    finalize(from_usage, [Chunk("a", 1.0, None), Chunk("b", 3.0, None)], 5)
    assert from_usage.total_tokens == 5 and from_usage.token_timestamps == [1.0, 1.5, 2.0, 2.5, 3.0]
    per_chunk = RequestResult(start_ts=0.0, first_token_ts=1.0)
    finalize(per_chunk, [Chunk("a", 1.0, None), Chunk("b", 3.0, None)], None)
    assert per_chunk.total_tokens == 2 and per_chunk.token_timestamps == [1.0, 3.0]


def arena_like_runs() -> list[BenchmarkRun]:
    one = metric([10.0, 20.0])
    return [BenchmarkRun(2, 0, 2048, 128, False, one, one, one, one, one, one, one, one, one),
            BenchmarkRun(2, 4096, 2048, 128, True, one, one, one, one, one, one, one, one, one),
            BenchmarkRun(2, 4096, 2048, 128, False, one, one, one, one, one, one, one, one, one)]


def test_row_names_csv_and_markdown_in_llama_benchys_shape():
    runs = arena_like_runs()
    names = [line.test_name for line in benchy_report.lines("m", runs, 10)]
    assert names == ["pp2048 (c2)", "tg128 (c2)", "ctx_pp @ d4096 (c2)", "ctx_tg @ d4096 (c2)",
                     "pp2048 @ d4096 (c2)", "tg128 @ d4096 (c2)"]
    assert [line.test_name for line in benchy_report.lines("m", runs[:1], 1)] == ["pp2048", "tg128"]
    rows = list(csv.reader(io.StringIO(benchy_report.csv_text("m", runs, 10))))
    assert tuple(rows[0]) == benchy_report.CSV_COLUMNS and len(rows) == 7
    assert rows[1][:4] == ["m", "pp2048 (c2)", "15.0", "5.0"] and rows[1][6:10] == ["", "", "", ""]
    table = benchy_report.markdown("m", runs, 10).splitlines()
    assert table[0].split("|")[3].strip() == "t/s (total)" and "t/s (req)" in table[0]
    assert table[1].startswith("|:--") and table[1].endswith("-:|")
    assert "15.00 ± 5.00" in table[2]
    single = benchy_report.markdown("m", runs[:1], 1).splitlines()[0]
    assert [h.strip() for h in single.split("|")[1:-1]] == ["model", "test", "t/s", "peak t/s", "ttfr (ms)",
                                                            "est_ppt (ms)", "e2e_ttft (ms)"]


def test_a_peak_without_a_tg_figure_is_a_row_for_llama_benchy_but_not_in_the_arenas_csv():
    peak_only = BenchmarkRun(1, 0, 64, 1, False, metric([100.0]), metric([100.0]), None, None, metric([1.0]),
                             metric([1.0]), metric([5.0]), metric([5.0]), metric([5.0]))
    assert [line.test_name for line in benchy_report.lines("m", [peak_only], 1)] == ["pp64", "tg1"]
    assert benchy_report.csv_text("m", [peak_only], 1, arena=True).count("\n") == 2  # header and pp64


def test_json_document_round_trips():
    header = benchy_report.Header("2026-01-01 00:00:00Z", "api", 1.5, "m", True, 2)
    doc = json.loads(json.dumps(benchy_report.document(header, arena_like_runs())))
    assert list(doc) == list(benchy_report.JSON_KEYS)
    assert [BenchmarkRun.from_json(b) for b in doc["benchmarks"]] == arena_like_runs()


def words(n: int) -> str:
    return " ".join(f"w{i % 997}" for i in range(n))


def test_prompts_have_exactly_the_requested_token_counts():
    corpus = Corpus(words(5000), WordTokenizer(), seed=1)
    context, prompt = corpus.generate(300, 2000)
    assert (len(context.split()), len(prompt.split())) == (2000, 300)
    context, prompt = corpus.generate(64, 0)
    assert context == "" and len(prompt.split()) == 64
    context, prompt = corpus.generate(100, 12000)  # longer than the corpus: it repeats, as llama-benchy's does
    assert (len(context.split()), len(prompt.split())) == (12000, 100)
    _, unique = corpus.generate(10, 0, no_cache=True)
    assert len(unique.split()) == 10  # the suffix counts in the prompt
    calibrated = Corpus(words(5000), WordTokenizer(tokens_per_word=2.0), seed=1)
    assert len(calibrated.generate(300, 0)[1].split()) == 150  # 2 server tokens a word


def test_a_tokenizer_json_cuts_prompts_in_its_own_tokens(tmp_path):
    vocab = {f"w{i}": i for i in range(997)} | {"[UNK]": 997}
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    inner.save(str(snapshot / "tokenizer.json"))
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc123")
    found = find_tokenizer(str(snapshot), None)
    assert found.name.endswith("tokenizer.json")
    corpus = Corpus(words(3000), found, seed=2)
    context, prompt = corpus.generate(128, 512)
    assert (len(found.encode(context)), len(found.encode(prompt))) == (512, 128)


def test_the_tokenizer_is_found_in_the_hf_cache_else_words(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert isinstance(find_tokenizer(None, "org/absent"), WordTokenizer)
    with pytest.raises(UsageError, match="no tokenizer.json"):
        find_tokenizer(str(tmp_path / "nothing"), None)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not a tokenizer.json"):
        find_tokenizer(str(bad), None)


def test_arena_v2_is_the_published_grid_in_its_order():
    order = ARENA_V2.order()
    assert len(order) == 28 and len(set(order)) == 28
    assert set(order) == {(d, c) for d in ARENA_V2_DEPTHS for c in (1, 2, 5, 10)}
    assert order[:3] == [(8192, 5), (4096, 5), (8192, 10)] and order[-1] == (100000, 10)
    assert (ARENA_V2.pp, ARENA_V2.tg, ARENA_V2.runs, ARENA_V2.prefix_caching) == ((2048,), (128,), 3, True)
    assert load_profile("arena-v2") is ARENA_V2


def test_a_profile_file_in_the_arenas_yaml(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("framework: llama-benchy\nargs:\n  pp: [64]\n  tg: [8]\n  depth: [0, 128]\n"
                    "  concurrency: [1, 2]\n  prefix_caching: true\n  runs: 2\n"
                    "schedule:\n  - {depth: 128, concurrency: 2}\n  - {depth: 0, concurrency: 1}\n")
    profile = load_profile(str(path))
    assert profile.order() == [(128, 2), (0, 1)] and profile.runs == 2 and profile.prefix_caching
    path.write_text("args: {depth: [0, 128], concurrency: [1, 2]}\n")
    assert load_profile(str(path)).order() == [(0, 1), (0, 2), (128, 1), (128, 2)]  # depth-major


@pytest.mark.parametrize("text, problem", [
    ("framework: vllm-bench\n", "not llama-benchy"),
    ("args: {pp: [zero]}\n", "args.pp"),
    ("args: {bogus: 1}\n", "bogus"),
    ("schedule: [{depth: 0}]\n", "schedule entry 1"),
    ("args: [\n", ":2"),
])
def test_a_bad_profile_names_what_is_wrong(tmp_path, text, problem):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=problem):
        load_profile(str(path))
