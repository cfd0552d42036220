"""The decode budget: the all-reduce share of a decode step from the model's shape, TP, verify's measured latency
(interpolated over message size) and the measured ITL, by hand for Llama-3-8B on TP 2; and `bench --json` carrying
it when the head keeps a last-verify record with latency (and saying "run verify" when it keeps none)."""

from __future__ import annotations

import json

import pytest

from sparkcluster.bench import cli as bench_cli
from sparkcluster.bench.ceiling import ServedModel
from sparkcluster.bench.decode_budget import (
    Curve,
    Inputs,
    Share,
    budget,
    describe,
    for_served,
    judge,
    latency_of,
)
from sparkcluster.node.modelconfig import step_shape
from sparkcluster.cli import build_parser
from tests.support.openai_stub import running_stub
from tests.support.bench import LLAMA_8B
from tests.support.bench import Head, PAIR_US, RECORD, connect_to


def llama_tp2(latency: Curve | None) -> Inputs:
    return Inputs("meta-llama/Meta-Llama-3-8B", step_shape(LLAMA_8B), tp=2, nodes=2, latency=latency)


def test_llama_3_8b_on_tp_2_by_hand():
    latency = latency_of(RECORD)
    assert latency is not None and latency.backend == "nccl"
    # c=1: ITL 30 ms; c=32: ITL 32 ms (the step grows little with the batch: decode reads the same weights).
    found = budget(llama_tp2(latency), [(1, 0.030), (32, 0.032)])
    one, many = found.steps
    # 32 layers x 2 all-reduces (attention's o_proj, the MLP's down_proj) + 1 (the vocabulary-parallel embedding)
    assert found.inputs.shape.all_reduces == 65
    # c=1: 1 token x 4096 hidden x 2 bytes (bfloat16) = 8,192 bytes, a size verify measured: 41 us each.
    # 65 x 41 us = 2,665 us = 2.665 ms of a 30 ms step = 8.9%: ok.
    assert (one.message_bytes, one.all_reduce_us, one.latency_read) == (8192, 41.0, "measured")
    assert one.all_reduces_ms == pytest.approx(2.665)
    assert one.share == pytest.approx(2.665 / 30) and one.verdict is Share.OK
    # c=32: 32 x 4096 x 2 = 262,144 bytes, a third of the way from 131,072 (120 us) to 524,288 (600 us):
    # 120 + (600 - 120) x (262,144 - 131,072) / (524,288 - 131,072) = 120 + 480 / 3 = 280 us each.
    # 65 x 280 us = 18,200 us = 18.2 ms of a 32 ms step = 56.9%: the all-reduces dominate.
    assert (many.message_bytes, many.latency_read) == (262144, "interpolated")
    assert many.all_reduce_us == pytest.approx(280.0)
    assert many.all_reduces_ms == pytest.approx(18.2)
    assert many.share == pytest.approx(18.2 / 32) and many.verdict is Share.DOMINANT
    assert found.verdict is Share.DOMINANT
    advice = found.advice()
    assert advice is not None and advice.startswith("the all-reduces dominate decode at c=32: serve fewer TP ranks")
    assert "`serve --replicas 2`" in advice
    assert "`sparkcluster verify`" in advice
    text = describe(found)
    assert "65 all-reduces per step = 2 per layer x 32 + the embedding's" in text
    assert "c=1: 8 KiB each, 41 us (measured) x 65 = 2.7 ms of a 30.0 ms ITL = 9%" in text
    assert "c=32: 256 KiB each, 280 us (interpolated) x 65 = 18.2 ms of a 32.0 ms ITL = 57% (dominates)" in text


def test_the_shares_bands_and_sizes_outside_what_verify_measured():
    assert [judge(s) for s in (0.29, 0.30, 0.49, 0.50)] == [Share.OK, Share.LARGE, Share.LARGE, Share.DOMINANT]
    curve = latency_of(RECORD)
    assert curve is not None
    assert curve.at(4096) == (41.0, "the smallest size's")  # below 8 KiB: the smallest's, an upper bound
    # 4 MiB: along the last segment, 4200 + (4200 - 600) x (4 MiB - 2 MiB) / (2 MiB - 512 KiB) = 9000 us.
    assert curve.at(4 << 20) == (pytest.approx(9000.0), "extrapolated")
    large = budget(llama_tp2(curve), [(8, 0.016)]).steps[0]
    # c=8: 65,536 bytes, 60 + 60 / 3 = 80 us; 65 x 80 us = 5.2 ms of 16 ms = 32.5%: large.
    assert large.all_reduce_us == pytest.approx(80.0) and large.verdict is Share.LARGE
    assert (budget(llama_tp2(curve), [(8, 0.016)]).advice() or "").startswith(
        "the all-reduces take a large share of decode at c=8")
    extrapolated = budget(llama_tp2(curve), [(512, 0.2)])
    assert any("extrapolated" in c for c in extrapolated.caveats())
    assert budget(llama_tp2(curve), [(1, None)]).steps[0].verdict is Share.UNKNOWN  # no ITL: no share


def test_unknown_latency_is_a_value_and_says_run_verify():
    assert latency_of({"status": "PASS", "busbw_gbps": 21.4}) is None  # a verify from before latency was timed
    assert latency_of({"latency_us": {"8192": 41.0}}) is None  # one size cannot say how latency grows
    found = budget(llama_tp2(None), [(1, 0.030)])
    assert found.verdict is Share.UNKNOWN
    step = found.steps[0]
    assert (step.message_bytes, step.all_reduce_us, step.share) == (8192, None, None)
    assert "run `sparkcluster verify`" in (found.advice() or "")
    assert "run `sparkcluster verify`" in describe(found) and "latency unknown" in describe(found)
    doc = found.to_json()
    assert doc["verify"] is None and doc["verdict"] == "unknown" and doc["rows"][0]["share"] is None


def test_tp_1_and_a_tp_group_smaller_than_the_verified_one():
    single = for_served(ServedModel("m", LLAMA_8B, None), {"nodes": ["spark-1"], "tp": 1}, RECORD)
    assert single is not None
    assert budget(single, [(1, 0.06)]).verdict is Share.NO_ALL_REDUCE
    assert "no all-reduce crosses a link" in describe(budget(single, [(1, 0.06)]))
    pp = for_served(ServedModel("m", LLAMA_8B, None), {"nodes": ["a", "b", "c", "d"], "tp": 2, "pp": 2}, RECORD)
    assert pp is not None and any("upper bound" in c for c in budget(pp, [(1, 0.03)]).caveats())
    assert for_served(ServedModel("m", {"model_type": "mystery"}, None), {"tp": 2}, RECORD) is None


# ---- bench --json on a served cluster whose head keeps a last-verify record -------------------------------------


def bench_output(capsys: pytest.CaptureFixture[str], verify: dict | None, *flags: str) -> str:
    # 3.5 ms: the all-reduces' 2.7 ms is then 76% of a step, clear of the 50% line even where a loaded CI machine
    # stretches the stub's ITL by half (at 5 ms it was 53%, and a measured 5.4 ms read as "large")
    with running_stub(ttft=0.01, itl=0.0035) as url:
        connect = connect_to(Head(url, verify))
        args = build_parser(["bench"]).parse_args(
            ["bench", *flags, "--concurrency", "1,2", "--runs", "1", "--requests-per-stream", "1",
             "--warmup", "0", "--prompt-tokens", "8", "--output-tokens", "8"])
        assert bench_cli.cmd_bench(args, connect) == 0
    return capsys.readouterr().out


def bench_json(capsys: pytest.CaptureFixture[str], verify: dict | None) -> dict:
    doc: dict = json.loads(bench_output(capsys, verify, "--json"))
    return doc


def test_bench_json_carries_the_budget_from_the_last_verify(capsys):
    doc = bench_json(capsys, RECORD)
    found = doc["decode_budget"]
    assert (found["tp"], found["layers"], found["hidden_size"], found["all_reduces_per_step"]) == (2, 32, 4096, 65)
    assert found["verify"]["latency_us"] == PAIR_US and found["verify"]["backend"] == "nccl"
    rows = {row["concurrency"]: row for row in found["rows"]}
    assert (rows[1]["message_bytes"], rows[1]["all_reduce_us"]) == (8192, 41.0)
    assert rows[2]["message_bytes"] == 16384 and rows[2]["latency_read"] == "interpolated"
    for row in doc["rows"]:  # each share is the all-reduces over the ITL bench measured at that concurrency
        budget_row = rows[row["concurrency"]]
        assert budget_row["itl_ms"] == pytest.approx(row["itl_s"]["p50"] * 1000)
        assert budget_row["share"] == pytest.approx(budget_row["all_reduces_ms"] / budget_row["itl_ms"])
    # the stub's 3.5 ms ITL against 65 x 41 us = 2.7 ms: over half the step
    assert rows[1]["verdict"] == "dominates" and found["verdict"] == "dominates"
    assert doc["config"]["decode_step"]["verify"]["latency_us"] == PAIR_US


def test_bench_json_without_a_verify_says_run_verify(capsys):
    found = bench_json(capsys, None)["decode_budget"]
    assert found["verdict"] == "unknown" and found["verify"] is None
    assert "run `sparkcluster verify`" in found["advice"]


def test_bench_prints_the_budget_under_its_table(capsys):
    text = bench_output(capsys, RECORD)
    section = text[text.index("decode budget (TP 2, meta-llama/Meta-Llama-3-8B): 65 all-reduces per step"):]
    assert "verify's latency (nccl, 2026-11-27T16:00:00+00:00)" in section
    assert "c=1: 8 KiB each, 41 us (measured) x 65 = 2.7 ms of a" in section
    # c=2: 16,384 bytes, a third of the way from 8 KiB (41 us) to 32 KiB (60 us): 41 + 19 / 3 = 47.3 us
    assert "c=2: 16 KiB each, 47 us (interpolated) x 65 = 3.1 ms of a" in section
    assert "the all-reduces dominate decode" in section
