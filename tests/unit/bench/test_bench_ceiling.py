"""The decode ceiling from a model's config.json: parameters of a dense and an MoE layout whose counts are
published (Llama 3 8B: 8.03 B; Mixtral 8x7B: 46.7 B total, 12.9 B active; gpt-oss-120b: 116.8 B, 5.1 B active
without the input embedding), bytes per token by dtype or quantisation, and the ceiling at 273 GB/s per node."""

from __future__ import annotations

import pytest
from rich.console import Console

from sparkcluster.bench.ceiling import (
    benchy_shares,
    ceiling,
    count_params,
    describe,
    effective_nodes,
    speedup_lines,
    speedups,
    weight_bytes,
)
from sparkcluster.bench.methods.closed_loop.arithmetic import Distribution, Row
from sparkcluster.bench.methods.closed_loop.sweep import Level
from sparkcluster.bench.methods.closed_loop.table import render
from tests.support.bench import LLAMA_8B

MIXTRAL = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
           "torch_dtype": "bfloat16"}
GPT_OSS_120B = {"hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
                "head_dim": 64, "intermediate_size": 2880, "vocab_size": 201088, "num_local_experts": 128,
                "experts_per_token": 4, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}}


def test_dense_parameters_and_ceiling():
    p = count_params(LLAMA_8B)
    assert p.total == pytest.approx(8.03e9, rel=0.005)
    assert p.active == pytest.approx(8.03e9 - 128256 * 4096, rel=0.005)  # the input embedding is a lookup
    assert (p.experts, p.expert_total) == (0, 0)
    c = ceiling("meta-llama/Llama-3.1-8B", LLAMA_8B, nodes=1)
    assert c.bytes_per_token == pytest.approx(2 * p.active)
    assert c.tokens_per_s == pytest.approx(273e9 / (2 * p.active))  # about 18 tok/s on one GB10
    assert ceiling("m", LLAMA_8B, nodes=2).tokens_per_s == pytest.approx(2 * c.tokens_per_s)
    assert ceiling("m", LLAMA_8B, nodes=1, bandwidth_gbps=546).tokens_per_s == pytest.approx(2 * c.tokens_per_s)
    assert len(c.caveats) == 1 and "KV-cache" in c.caveats[0]


def test_moe_counts_the_routed_experts_only():
    p = count_params(MIXTRAL)
    assert p.total == pytest.approx(46.7e9, rel=0.005)
    assert p.active + 32000 * 4096 == pytest.approx(12.9e9, rel=0.01)
    assert (p.experts, p.experts_per_token) == (8, 2)
    c = ceiling("mistralai/Mixtral-8x7B", MIXTRAL, nodes=2)
    assert c.tokens_per_s == pytest.approx(2 * 273e9 / (2 * p.active))
    assert any("2 of 8 experts" in caveat for caveat in c.caveats)


def test_mxfp4_experts_with_bfloat16_elsewhere():
    p = count_params(GPT_OSS_120B)
    assert p.total == pytest.approx(116.8e9, rel=0.01)
    assert p.active - 201088 * 2880 == pytest.approx(4.54e9, rel=0.02)  # 5.1 B active counts the LM head
    expert, other, fmt = weight_bytes(GPT_OSS_120B)
    assert (expert, other, fmt) == (4.25 / 8, 2.0, "mxfp4 experts, bfloat16 elsewhere")
    c = ceiling("openai/gpt-oss-120b", GPT_OSS_120B, nodes=2)
    assert c.bytes_per_token == pytest.approx(p.expert_active * 4.25 / 8 + (p.active - p.expert_active) * 2)
    # about 5 GB per token (1.9 GB of MXFP4 experts, 3.1 GB of bfloat16 attention and LM head) on 2 x 273 GB/s
    assert 100 < c.tokens_per_s < 120


def test_awq_bits_and_a_stored_size_far_from_the_estimate():
    awq = {**LLAMA_8B, "quantization_config": {"quant_method": "awq", "bits": 4}}
    assert weight_bytes(awq)[0] == pytest.approx(0.5 + 0.03)
    rough = ceiling("m", LLAMA_8B, nodes=1, stored_bytes=int(4.5e9))
    assert any("bytes per weight are a guess" in caveat for caveat in rough.caveats)
    assert not any("guess" in caveat for caveat in ceiling("m", LLAMA_8B, 1, stored_bytes=int(16.1e9)).caveats)


def test_a_config_without_the_shape_is_refused():
    with pytest.raises(ValueError):
        count_params({"model_type": "mystery"})


def _level(c: int, gen: float, itl: float | None) -> Level:
    d, gap = Distribution(0.2, 0.2, 0.2, 0.2), Distribution(itl, itl, itl, itl)
    return Level(Row(c, gen * 10, gen, gen * 2, d, gap, d, 8, 800, 64, 0), None)


def test_the_table_shows_each_rows_decode_as_a_share_of_the_ceiling():
    levels = [_level(1, 9.0, 1 / 9.0), _level(4, 30.0, None)]
    text = _text(render(levels, "t", ceiling_tps=18.0))
    assert "of ceiling" in text
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert rows[0][-1] == "50%"  # 1 / ITL p50 = 9 tok/s of 18
    assert rows[1][-1] == "42%"  # no ITL: 30 tok/s over 4 streams = 7.5 of 18
    assert "of ceiling" not in _text(render(levels, "t"))


def _text(table: object) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()


def test_speedup_over_a_one_node_run_and_the_ceiling_line():
    baseline = {"config": {"nodes": ["spark-1"], "pp": 1}, "rows": [{"concurrency": 1, "generation_tps": 10.0}]}
    levels = [_level(1, 13.0, None), _level(2, 20.0, None)]
    assert speedups(levels, baseline) == [{"concurrency": 1, "generation_tps": 13.0, "baseline_generation_tps": 10.0,
                                           "speedup": 1.3}]
    assert "c=1 1.30x" in speedup_lines(levels, baseline) and "(1 node)" in speedup_lines(levels, baseline)
    assert effective_nodes({"nodes": ["a", "b"], "pp": 2}) == 1 and effective_nodes({"nodes": ["a", "b"]}) == 2
    line = describe(ceiling("openai/gpt-oss-120b", GPT_OSS_120B, nodes=2).to_json())
    assert line.startswith("decode ceiling at concurrency 1: 109.") and "2 nodes x 273 GB/s" in line
    assert "rough: " in line and "MoE" in line


def test_llama_benchys_tg_cells_as_a_share_of_the_ceiling():
    from sparkcluster.bench.methods.llama_benchy.arithmetic import BenchmarkRun, Metric

    doc = {"tokens_per_s": 100.0}
    runs = [BenchmarkRun(1, 0, 2048, 32, False, tg_req_throughput=Metric(55.0, 1.0, (55.0,))),
            BenchmarkRun(2, 4096, 2048, 32, False, tg_req_throughput=Metric(40.0, 1.0, (40.0,))),
            BenchmarkRun(1, 4096, 0, 0, True, tg_req_throughput=Metric(9.0, 0.0, (9.0,)))]
    assert benchy_shares(runs, doc) == ["  tg32 c1: 55.0 t/s per request = 55% of the ceiling",
                                        "  tg32 @ d4096 c2: 40.0 t/s per request = 40% of the ceiling"]
