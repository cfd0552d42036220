"""`bench --explain A B`: two results' receipts lined up field by field, every difference named and ranked by what it
can explain (a flag before a node's kernel), the numbers side by side; against a recipe's published row, what that
row never recorded; bad input refused with the fix (exit 2) before anything connects."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sparkcluster.bench.explain.facts import Cause
from sparkcluster.bench.explain.lineup import explain, render
from sparkcluster.bench.explain.sides import sides
from sparkcluster.bench.receipt import Engine
from sparkcluster.bench.receipt_metrics import EngineDeltas, SpecDecode
from tests.support.helpers import run_cli
from tests.support.bench import COMMAND, receipt, result


def test_a_flag_and_a_kernel_are_both_named_the_flag_first(tmp_path):
    a = result(tmp_path, "a.json", receipt())
    b = result(tmp_path, "b.json", receipt((*COMMAND, "--enforce-eager"), kernel="6.14.0-1013-nvidia"), (6.0, 11.0))
    found = explain(*sides([a, b], None))
    keys = [d.key for d in found.differences]
    assert keys == ["--enforce-eager", "spark-2 kernel"], keys
    flag, kernel = found.differences
    assert (flag.a, flag.b, flag.cause) == ("not set", "set", Cause.FLAGS)
    assert "CUDA graphs" in flag.why
    assert (kernel.a, kernel.b, kernel.cause) == ("6.11.0-1016-nvidia", "6.14.0-1013-nvidia", Cause.PLATFORM)
    assert [(f.row, f.figure, f.a, f.b) for f in found.figures if f.figure == "generation tok/s"] == [
        ("c=1", "generation tok/s", 10.0, 6.0), ("c=2", "generation tok/s", 18.0, 11.0)]
    assert "--max-model-len" in found.same and "spark-1 kernel" in found.same

    shown = run_cli("bench", "--explain", a, b)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "  1. --enforce-eager: A not set, B set  [flag: CUDA graphs] no CUDA graphs" in out
    assert "  2. spark-2 kernel: A 6.11.0-1016-nvidia, B 6.14.0-1013-nvidia  [kernel, driver, firmware" in out
    assert "c=1  generation tok/s  10.0 -> 6.0  (60%)" in out, out
    as_json = json.loads(run_cli("bench", "--explain", a, b, "--json").stdout)
    assert [(d["field"], d["cause"]) for d in as_json["differences"]] == [("--enforce-eager", "flags"),
                                                                          ("spark-2 kernel", "platform")]


def test_acceptance_ranks_above_every_flag_and_says_what_it_scales(tmp_path):
    spec = (("--speculative-config", '{"method":"ngram","num_speculative_tokens":2}'))
    high = EngineDeltas(True, SpecDecode(100, 200, 148, (80, 68)), 0.0, 0.0)
    low = EngineDeltas(True, SpecDecode(100, 200, 70, (50, 20)), 0.0, 0.0)
    a = result(tmp_path, "a.json", receipt((*COMMAND, *spec), metrics=high))
    b = result(tmp_path, "b.json", receipt((*COMMAND, *spec, "--max-num-seqs", "8"), metrics=low))
    found = explain(*sides([a, b], None))
    assert [d.key for d in found.differences] == [
        "mean acceptance length", "acceptance rate", "acceptance at position 0", "acceptance at position 1",
        "--max-num-seqs"]
    assert "B's decode is about 69% of A's" in found.differences[0].why  # 1.70 / 2.48
    assert "  2. acceptance rate: A 74%, B 35%  [speculative acceptance (scales decode directly)]" in render(found)


def test_against_a_published_row_it_lists_what_the_row_never_recorded(tmp_path):
    a = result(tmp_path, "a.json", dataclasses.replace(receipt(), engine=dataclasses.replace(
        receipt().engine, command=("vllm", "serve", "openai/gpt-oss-120b", "--max-num-seqs", "256"))))
    found = explain(*sides([a], "gpt-oss-120b"))
    assert found.b.published and "verified 2026-05-06" in found.b.name
    for never in ("the vLLM version", "the image's digest", "each node's kernel, driver, BIOS, ConnectX firmware, NCCL",
                  "speculative acceptance, prefix-cache hit rate, preemptions (the engine's /metrics)",
                  "the bench's parameters and its prompt set"):
        assert never in found.never_recorded, found.never_recorded
    keys = [d.key for d in found.differences]
    assert "--kv-cache-dtype" in keys and "--max-num-seqs" not in keys  # the recipe's flags, lined up with ours
    assert keys.index("--kv-cache-dtype") < keys.index("--reasoning-parser")  # no effect on speed: last
    assert [(f.row, f.a, f.b) for f in found.figures if f.figure == "generation tok/s"] == [("c=1", 10.0, 60.4),
                                                                                          ("c=2", 18.0, 80.3)]
    out = run_cli("bench", "--explain", a, "--compare", "gpt-oss-120b").stdout
    assert "the published row never recorded:\n  the vLLM version\n  the image\n" in out, out
    assert "2. --compilation-config: A not set, B {\"cudagraph_capture_sizes\":[1,2,4,5,8,10,16,24,32,40,48,5..." in out, out


def test_a_bare_url_result_says_what_it_cannot_know(tmp_path):
    bare = dataclasses.replace(receipt(), nodes=None, comm_env=None, metrics=None,
                               engine=Engine("0.32.0"))
    found = explain(*sides([result(tmp_path, "a.json", receipt()),
                                            result(tmp_path, "b.json", bare)], None))
    assert "nodes: unknown to B" in found.unknown and "engine.command: unknown to B" in found.unknown
    assert not any(d.key.startswith("spark-") or d.key.startswith("--") for d in found.differences)


@pytest.mark.parametrize(("content", "said"), [
    (None, "no such file"),
    ("rows,of,csv\n", "not JSON (Expecting value), so not a bench result"),
    ('{"hello": 1}', "is not a bench result (it holds neither `rows` nor `benchmarks`)"),
    ('{"rows": []}', "holds no receipt"),
    ('{"rows": [], "receipt": {"version": 99}}', "its receipt cannot be read: receipt version 99"),
])
def test_bad_input_is_refused_with_the_fix(tmp_path, content, said):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    good = result(tmp_path, "good.json", receipt())
    refused = run_cli("bench", "--explain", str(path), good)
    err = " ".join(refused.stderr.split())
    assert refused.returncode == 2, err
    assert said in err and "bench --json" in err, err


def test_one_result_alone_or_three_are_refused(tmp_path):
    good = result(tmp_path, "good.json", receipt())
    alone = run_cli("bench", "--explain", good)
    assert alone.returncode == 2 and "needs something to compare with" in alone.stderr
    three = run_cli("bench", "--explain", good, good, good)
    assert three.returncode == 2 and "--explain A B" in " ".join(three.stderr.split())


def test_a_command_line_that_is_not_flags_is_unknown_not_empty(tmp_path):
    garbled = result(tmp_path, "b.json", receipt(("vllm", "serve", "m", "stray", "--max-model-len", "384")))
    found = explain(*sides([result(tmp_path, "a.json", receipt()), garbled], None))
    assert "engine.command: unknown to B" in found.unknown
    assert "--max-model-len" not in [d.key for d in found.differences]


def test_clusters_naming_their_nodes_differently_are_lined_up_by_position(tmp_path):
    theirs = receipt(kernel="6.14.0-1013-nvidia")
    renamed = dataclasses.replace(theirs, nodes=tuple(dataclasses.replace(n, name=f"gx10-{i}")
                                                      for i, n in enumerate(theirs.nodes or ())),
                                  comm_env={"gx10-0": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"},
                                            "gx10-1": {"NCCL_SOCKET_IFNAME": "enp1s0f1np1"}})
    found = explain(*sides([result(tmp_path, "a.json", receipt()), result(tmp_path, "b.json", renamed)], None))
    assert [(d.key, d.b) for d in found.differences] == [("node 2 kernel", "6.14.0-1013-nvidia"),
                                                         ("node 2 NCCL_SOCKET_IFNAME", "enp1s0f1np1")]
    assert "node 1 kernel" in found.same


def test_llama_benchy_results_are_lined_up_by_shape(tmp_path):
    def benchy(name: str, tg: float) -> str:
        entry = {"concurrency": 1, "context_size": 0, "prompt_size": 64, "response_size": 16,
                 "is_context_prefill_phase": False, "tg_throughput": {"mean": tg}, "pp_throughput": {"mean": 900.0}}
        path = tmp_path / name
        path.write_text(json.dumps({"benchmarks": [entry], "receipt": receipt().to_json()}))
        return str(path)
    found = explain(*sides([benchy("a.json", 20.0)], benchy("b.json", 15.0)))
    assert [(f.row, f.figure, f.a, f.b) for f in found.figures] == [("pp64 tg16 @ d0 c=1", "tg t/s", 20.0, 15.0),
                                                                    ("pp64 tg16 @ d0 c=1", "pp t/s", 900.0, 900.0)]
    assert found.differences == ()


def test_a_tuned_nccl_setting_is_one_cluster_fact_ranked_with_the_flags_by_the_decode_all_reduces(tmp_path):
    """verify --tune's choice (issue 50) differs between two runs: it is named once for the cluster, under the engine's
    flags after CUDA graphs and before caching, and never buried with the nodes' kernels."""
    def tuned(env: dict[str, dict[str, str]]):
        made = receipt((*COMMAND, "--max-num-seqs", "8", "--enable-prefix-caching"), kernel="6.14.0-1013-nvidia")
        return dataclasses.replace(made, comm_env={node: {**made.comm_env[node], **extra}
                                                   for node, extra in env.items()})
    a = result(tmp_path, "a.json", receipt())
    b = result(tmp_path, "b.json", tuned({"spark-1": {"NCCL_PROTO": "LL"}, "spark-2": {"NCCL_PROTO": "LL"}}))
    found = explain(*sides([a, b], None))
    assert [d.key for d in found.differences] == ["--max-num-seqs", "NCCL_PROTO", "--enable-prefix-caching",
                                                  "spark-2 kernel"]
    line = next(l for l in render(found).splitlines() if "NCCL_PROTO" in l)
    assert line.startswith("  2. NCCL_PROTO: A not set, B LL  [NCCL setting: the decode all-reduces] an NCCL "
                           "setting (of those verify --tune chooses by measurement)"), line
    doc = next(d for d in found.to_json()["differences"] if d["field"] == "NCCL_PROTO")
    assert (doc["cause"], doc["kind"]) == ("flags", "NCCL setting: the decode all-reduces")

    split = result(tmp_path, "c.json", tuned({"spark-1": {"NCCL_PROTO": "LL"}, "spark-2": {}}))
    mixed = explain(*sides([a, split], None))
    assert next(d.b for d in mixed.differences if d.key == "NCCL_PROTO") == \
        "differs by node: spark-1 LL, spark-2 not set"
    assert not any(d.key.endswith(" NCCL_PROTO") for d in mixed.differences)  # never per node as well

    # the tuner plugin's table in each node's own home: one table, named by its file
    table = {"NCCL_TUNER_CONFIG_FILE": "{}/.config/sparkcluster/nccl-tuner/sizes-0123456789ab.csv"}
    homes = result(tmp_path, "d.json", tuned({"spark-1": {k: v.format("/home/a") for k, v in table.items()},
                                              "spark-2": {k: v.format("/home/b") for k, v in table.items()}}))
    tuner = next(d for d in explain(*sides([a, homes], None)).differences if d.key == "NCCL_TUNER_CONFIG_FILE")
    assert (tuner.a, tuner.b) == ("not set", "sizes-0123456789ab.csv")
