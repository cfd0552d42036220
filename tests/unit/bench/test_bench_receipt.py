"""The receipt: the engine's /metrics as deltas over the measurement (vLLM 0.32's exact counter names and labels),
unknowns named, secrets masked, and JSON that reads back to the same value."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sparkcluster.bench.receipt import (
    BenchParams,
    Engine,
    Mod,
    NodeReceipt,
    Receipt,
    RecipeUsed,
    masked_env,
)
from sparkcluster.bench.receipt_metrics import REPLICA_LABEL, EngineDeltas, SpecDecode, deltas
from sparkcluster.observe.prometheus import Scrape, parse
from tests.support.helpers import run_cli
from tests.support.openai_stub import running_stub


def vllm_metrics(drafts: float, draft_tokens: float, accepted: float, per_pos: tuple[float, ...],
                 hits: float = 0, queries: float = 0, preemptions: float = 0) -> str:
    """/metrics as vLLM 0.32 writes it (prometheus_client's text: `_total` on counters, engine and model labels)."""
    labels = 'engine="0",model_name="tiny"'
    lines = [
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {draft_tokens}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}",
        *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {a}'
          for i, a in enumerate(per_pos)),
        f"vllm:prefix_cache_hits_total{{{labels}}} {hits}",
        f"vllm:prefix_cache_queries_total{{{labels}}} {queries}",
        f"vllm:num_preemptions_total{{{labels}}} {preemptions}",
    ]
    return "\n".join(lines) + "\n"


def test_acceptance_figures_are_deltas_over_the_measurement() -> None:
    # Before: the warm-up and an earlier bench left 100 drafts behind; only the 200 drafts after them count.
    before = parse(vllm_metrics(100, 200, 150, (90, 60), hits=10, queries=100, preemptions=1))
    after = parse(vllm_metrics(300, 600, 350, (170, 180), hits=60, queries=300, preemptions=4))
    got = deltas(before, after, 12.3456)
    assert got is not None and got.speculative is True and got.spec_decode is not None
    spec = got.spec_decode
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (200, 400, 200)
    assert spec.accepted_per_position == (80, 120)
    assert spec.acceptance_rate == pytest.approx(0.5)
    assert spec.mean_acceptance_length == pytest.approx(2.0)  # 1 + 200 accepted / 200 drafts
    assert spec.per_position_acceptance == pytest.approx((0.4, 0.6))
    assert got.prefix_cache_hit_rate == pytest.approx(50 / 200)
    assert got.preemptions == 3
    assert got.interval_s == 12.346


def test_an_engine_without_speculation_says_so_and_no_metrics_is_unknown() -> None:
    plain = "vllm:num_preemptions_total{engine=\"0\"} 2\nvllm:prefix_cache_queries_total{engine=\"0\"} 0\n"
    got = deltas(parse(plain), parse(plain))
    assert got == EngineDeltas(False, None, None, 0)
    assert deltas(None, parse(plain)) is None  # /metrics did not answer: unknown, not zero
    assert deltas(parse(""), parse("")) is None  # an empty page is no vLLM's


def test_a_counter_reset_mid_run_is_unknown_not_negative() -> None:
    got = deltas(parse(vllm_metrics(300, 600, 350, (170, 180))), parse(vllm_metrics(10, 20, 5, (3, 2))))
    assert got is not None and got.speculative is None and got.spec_decode is None


def test_a_bare_url_receipt_names_what_cannot_be_known() -> None:
    receipt = Receipt("http://them:8000/v1", Engine(vllm_version="0.32.0"), BenchParams("sustained", {}, "ab12"))
    unknown = receipt.unknown()
    for path in ("engine.command", "engine.image_id", "engine.recipe", "comm_env", "nodes", "metrics"):
        assert path in unknown
    assert "engine.vllm_version" not in unknown and "bench.prompt_digest" not in unknown
    assert receipt.to_json()["unknown"] == list(unknown)


def test_what_does_not_apply_is_not_unknown() -> None:
    receipt = Receipt("http://spark-1:8000/v1",
                      Engine("0.32.0", ("vllm", "serve", "m"), "host", "ray", python_env="/opt/venv", tp=2, pp=1,
                             replicas=1),
                      BenchParams("sustained"), {"spark-1": {}}, (NodeReceipt("spark-1", "6.17", "580.95"),),
                      EngineDeltas(False, None, 0.0, 0))
    unknown = receipt.unknown()
    assert not any(p.startswith(("engine.image", "engine.recipe", "metrics.spec_decode")) for p in unknown)
    assert "nodes[spark-1].bios" in unknown and "nodes[spark-1].kernel" not in unknown


def test_json_reads_back_to_the_same_receipt() -> None:
    receipt = Receipt(
        "http://10.0.0.1:8000/v1",
        Engine("0.32.0", ("vllm", "serve", "m", "--tensor-parallel-size", "2"), "docker", "ray", "vllm-node",
               "sha256:abc", "vllm-node@sha256:def", None, RecipeUsed("@eugr/qwen", "f00", (Mod("fix.sh", "ba5"),)),
               2, 1, 1),
        BenchParams("llama-benchy", {"pp": [512], "tg": [32]}, "c0ffee"),
        {"spark-1": masked_env({"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "HF_TOKEN": "hf_secret"})},
        (NodeReceipt("spark-1", "6.17.0-1008-nvidia", "580.95.05", "5.36", {"enp1s0f0np0": "28.45.1200"},
                     "2.28.3", "13.0"),),
        EngineDeltas(True, SpecDecode(10, 20, 15, (9, 6)), 0.5, 0, 3.0))
    text = json.dumps(receipt.to_json())
    assert "hf_secret" not in text and json.loads(text)["comm_env"]["spark-1"]["HF_TOKEN"] == "***"
    assert Receipt.from_json(json.loads(text)) == receipt


@pytest.mark.parametrize("doc, why", [([], "JSON object"), ({"version": 99}, "version 99"),
                                      ({"version": 1}, "missing")])
def test_an_unreadable_receipt_says_why(doc: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Receipt.from_json(doc)


FIXTURES = Path(__file__).parents[2] / "fixtures" / "bench"


def test_a_real_cpu_vllm_with_ngram_speculation_gives_its_acceptance() -> None:
    """Two scrapes of the CPU vLLM 0.32 serving the tiny Llama with ngram speculation (fixtures/bench/README-receipt.md)."""
    before, after = (parse((FIXTURES / f"vllm-0.32-cpu-ngram-metrics-{w}.txt").read_text()) for w in ("before", "after"))
    got = deltas(before, after)
    assert got is not None and got.spec_decode == SpecDecode(96, 184, 134, (77, 57))
    assert got.spec_decode.acceptance_rate == pytest.approx(134 / 184)
    assert got.spec_decode.mean_acceptance_length == pytest.approx(1 + 134 / 96)
    assert got.spec_decode.per_position_acceptance == pytest.approx((77 / 96, 57 / 96))
    assert got.prefix_cache_hit_rate == 0 and got.preemptions == 0


def test_bench_json_carries_a_receipt_whose_acceptance_counts_the_measurement_only(tmp_path: Path) -> None:
    """`bench --url --json` against a server speculating 3 tokens a draft, one accepted: the warm-up's drafts are left
    out (before the first measured request), and what a bare --url cannot know is marked unknown. --csv's rows get
    the same receipt beside them."""
    once = ("--concurrency", "1", "--runs", "1", "--requests-per-stream", "2", "--warmup", "1",
            "--prompt-tokens", "16", "--output-tokens", "20")
    with running_stub(spec_tokens=3) as url:
        result = run_cli("bench", "--url", url, "--json", *once, "--csv", str(tmp_path / "rows.csv"), timeout=60)
    assert result.returncode == 0, result.stderr
    receipt = json.loads(result.stdout)["receipt"]
    spec = receipt["metrics"]["spec_decode"]
    assert receipt["metrics"]["speculative"] is True
    assert spec["drafts"] == 20  # 2 measured requests x 20 tokens / 2; the warm-up's 10 drafts are not counted
    assert (spec["draft_tokens"], spec["accepted_per_position"]) == (60, [20, 0, 0])
    assert spec["acceptance_rate"] == pytest.approx(1 / 3) and spec["mean_acceptance_length"] == 2
    assert receipt["engine"]["vllm_version"] == "stub"  # what the endpoint itself says, and only that
    assert {"engine.command", "engine.runtime", "engine.image_id", "nodes", "comm_env"} <= set(receipt["unknown"])
    assert receipt["bench"]["method"] == "sustained" and len(receipt["bench"]["prompt_digest"]) == 64
    assert Receipt.from_json(receipt).metrics is not None
    assert json.loads((tmp_path / "rows.csv.receipt.json").read_text()) == receipt


def test_a_plots_caption_names_the_engine_the_platform_and_the_acceptance_where_known() -> None:
    receipt = Receipt("http://10.0.0.1:8000/v1", Engine("0.32.0+cpu", runtime="host", python_env="/opt/venv", tp=2, pp=1,
                                                        replicas=1),
                      BenchParams("sustained"), None,
                      (NodeReceipt("spark-1", "6.17.0", "580.95.05"), NodeReceipt("spark-2", "6.17.0", "580.95.05")),
                      EngineDeltas(True, SpecDecode(10, 20, 15), None, 0), created="2026-11-27T17:00:00+00:00")
    assert receipt.caption() == ("vLLM 0.32.0+cpu · TP 2 x PP 1 · host (/opt/venv) · kernel 6.17.0, driver 580.95.05 · "
                                 "acceptance 75% (mean length 2.50) · sparkcluster 0.1.0, 2026-11-27")
    bare = Receipt("http://them/v1", Engine(), BenchParams("sustained"), created="2026-11-27T17:00:00+00:00")
    assert bare.caption() == "vLLM unknown · sparkcluster 0.1.0, 2026-11-27"


def test_llama_benchys_json_csv_and_arena_files_carry_the_receipt(tmp_path: Path) -> None:
    """llama-benchy's document holds the receipt under `sparkcluster` (its own keys unchanged), its CSV keeps
    llama-benchy's columns with the receipt beside it (FILE.receipt.json), a profile's --out DIR gets receipt.json."""
    book = tmp_path / "book.txt"
    book.write_text(" ".join(f"w{i % 300}" for i in range(5000)))
    shape = ("--pp", "64", "--tg", "8", "--depth", "0", "--concurrency", "1", "--runs", "1", "--skip-coherence")
    profile = tmp_path / "small.yaml"
    profile.write_text("framework: llama-benchy\nargs: {pp: [64], tg: [8], depth: [0], concurrency: [1], runs: 1}\n")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HOME": str(tmp_path)}
    with running_stub(ttft=0.005, itl=0.001, spec_tokens=2) as url:
        result = run_cli("bench", "--url", url, "--method", "llama-benchy", "--corpus", str(book), *shape,
                         "--csv", str(tmp_path / "b.csv"), "--json", env=env, timeout=120)
        arena = run_cli("bench", "--url", url, "--profile", str(profile), "--out", str(tmp_path / "out"),
                        "--corpus", str(book), env=env, timeout=120)
    assert result.returncode == 0 and arena.returncode == 0, result.stderr + arena.stderr
    receipt = json.loads(result.stdout)["sparkcluster"]["receipt"]
    assert receipt["bench"]["method"] == "llama-benchy" and receipt["bench"]["parameters"]["cells"] == [
        "d=0 pp=64 tg=8 c=1"]
    assert len(receipt["bench"]["prompt_digest"]) == 64
    spec = receipt["metrics"]["spec_decode"]
    assert spec["drafts"] > 0 and spec["acceptance_rate"] == pytest.approx(1 / 2)
    assert spec["accepted_per_position"] == [spec["drafts"], 0]
    assert json.loads((tmp_path / "b.csv.receipt.json").read_text()) == receipt
    assert (tmp_path / "b.csv").read_text().splitlines()[0].startswith("model,")  # llama-benchy's header, alone
    in_arena = json.loads((tmp_path / "out" / "receipt.json").read_text())
    assert in_arena["bench"]["method"] == "llama-benchy" and in_arena["metrics"]["speculative"] is True


def test_one_replicas_reset_is_not_hidden_by_anothers_growth() -> None:
    # Failed before: behind the router the replicas' samples were summed first, so replica 0 restarting (10 -> 2
    # preemptions) while replica 1 added 20 read as 12 preemptions over the run.
    def two(first: int, second: int) -> Scrape:
        replicas = [parse(f'vllm:num_preemptions_total{{engine="0"}} {n}\n') for n in (first, second)]
        return Scrape(tuple(replace(s, labels=(*s.labels, (REPLICA_LABEL, str(i))))
                            for i, scrape in enumerate(replicas) for s in scrape.samples))

    assert deltas(two(10, 0), two(2, 20)).preemptions is None  # type: ignore[union-attr]
    assert deltas(two(10, 0), two(12, 20)).preemptions == 22  # type: ignore[union-attr]
