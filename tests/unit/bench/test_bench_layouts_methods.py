"""`bench --layouts` measures each layout with the method bench's flags pick, run as the one shell runs it
(layouts/methods.py): the closed loop as before, and `--method llama-benchy` too, its plan made before anything
connects and its cells measured against each layout's endpoint (here an OpenAI stub on loopback)."""

from __future__ import annotations

import json
from contextlib import contextmanager, nullcontext

import pytest

from sparkcluster import cli
from sparkcluster.bench.cli import cmd_bench
from sparkcluster.bench.layouts import cli as layouts_cli
from sparkcluster.bench.layouts import methods, run, state
from sparkcluster.bench.methods.closed_loop import cli as closed_loop_cli
from sparkcluster.bench.methods.llama_benchy import cli as llama_benchy_cli
from sparkcluster.bench.methods.llama_benchy import head_tokenizer
from sparkcluster.bench.target import Target
from sparkcluster.engine.cliapp import selected_inventory
from sparkcluster.engine.errors import UsageError
from tests.support.bench import corpus
from tests.support.bench_layouts import Cluster, inventory_file
from tests.support.openai_stub import running_stub


def parsed(*flags: str):
    args = cli.build_parser(["bench"]).parse_args(["bench", "--layouts", "tp,replicas", "--out", "results", *flags])
    args.remote = []
    return args


def test_the_plan_builds_for_both_methods_before_anything_connects():
    sustained = methods.for_flags(parsed("--concurrency", "1,4"))
    assert isinstance(sustained, methods.Sustained)
    plan = sustained.plan(parsed("--concurrency", "1,4"))
    assert isinstance(plan, closed_loop_cli.Plan) and sustained.concurrency(plan) == (1, 4)
    # the keys a state written before this change holds, so it still resumes
    assert list(sustained.inputs(plan)) == ["concurrency", "prompt_tokens", "output_tokens", "runs", "warmup",
                                            "requests_per_stream", "prefix_cache"]

    args = parsed("--method", "llama-benchy", "--pp", "64", "--tg", "8", "--concurrency", "1", "2")
    benchy = methods.for_flags(args)
    assert isinstance(benchy, methods.LlamaBenchy)
    plan = benchy.plan(args)  # --out is --layouts' folder here, not a profile's
    assert isinstance(plan, llama_benchy_cli.Plan) and benchy.concurrency(plan) == (1, 2)
    assert benchy.inputs(plan)["cells"] == ["d=0 pp=64 tg=8 c=1", "d=0 pp=64 tg=8 c=2"]
    assert benchy.inputs(plan)["method"] == "llama-benchy"  # a sustained state is never resumed as llama-benchy's

    with pytest.raises(UsageError, match="--pp 0 is not a list"):  # its own refusals, as without --layouts
        benchy.plan(parsed("--method", "llama-benchy", "--pp", "0"))


def test_a_flag_of_the_other_method_is_refused_with_layouts_too(tmp_path, capsys):
    args = parsed("-i", str(inventory_file(tmp_path, 2)), "--method", "llama-benchy", "--requests-per-stream", "2")
    with pytest.raises(UsageError, match="--requests-per-stream: not a flag of --method llama-benchy"):
        cmd_bench(args, None)  # type: ignore[arg-type]


def test_layouts_with_llama_benchy_serves_and_measures_each_layout_and_resumes(tmp_path, capsys, monkeypatch):
    cluster = Cluster()
    monkeypatch.setattr(layouts_cli, "one_at_a_time", lambda session: nullcontext())
    monkeypatch.setattr(layouts_cli, "stage_once", lambda session, todo, emit: 1.0)
    monkeypatch.setattr(layouts_cli, "serve_on", lambda session, emit: cluster.serve)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HOME", str(tmp_path))

    @contextmanager
    def connect(args, check, require_all=True):
        check(selected_inventory(args))
        yield object()

    out = tmp_path / "out"
    with running_stub(itl=0.002) as endpoint:  # tokens 2 ms apart: llama-benchy's tg needs time between them
        monkeypatch.setattr(run, "from_cluster", lambda session, nodes=None: Target(endpoint, None))
        args = parsed("-i", str(inventory_file(tmp_path, 2)), "--model", "org/m", "--method", "llama-benchy",
                      "--corpus", str(corpus(tmp_path)), "--pp", "32", "--tg", "16", "--runs", "1", "--no-warmup",
                      "--skip-coherence", "--out", str(out), "--json")
        assert cmd_bench(args, connect) == 0
        doc = json.loads(capsys.readouterr().out)
        assert cluster.served == ["tp", "replicas"]
        assert doc["config"]["method"]["name"] == "llama-benchy"
        assert doc["config"]["method"]["cells"] == ["d=0 pp=32 tg=16 c=1"]
        for entry in doc["layouts"]:
            assert entry["rows"] == [] and [b["prompt_size"] for b in entry["benchmarks"]] == [32]
            assert entry["benchmarks"][0]["tg_throughput"]["mean"] > 0
            assert entry["receipt"]["bench"]["method"] == "llama-benchy"
        assert doc["best"]["1"] in ("tp", "replicas")
        saved = json.loads((out / state.STATE_FILE).read_text())
        assert [m["layout"] for m in saved["done"]] == ["tp", "replicas"]

        args.json = False  # the same command again: every layout kept, none served, the table from the state
        assert cmd_bench(args, connect) == 0
    printed = capsys.readouterr()
    assert cluster.served == ["tp", "replicas"]
    err = [line for line in printed.err.splitlines() if "measured before, kept from" in line]
    assert [line.split(" ")[0] for line in err] == ["tp", "replicas"], printed.err
    table = [" ".join(line.split()) for line in printed.out.splitlines()]
    assert any(line.startswith("1 tp (tp2) ") for line in table), printed.out
    assert "TTFR" in printed.out and "<- best" in printed.out


def test_the_served_models_tokenizer_is_taken_from_the_head_by_one_rule_for_bench_and_layouts(tmp_path, monkeypatch):
    """head_tokenizer.for_target, which bench's find_target and --layouts' measure both ask: nothing where
    --tokenizer gave one or the record names no model; else this machine's earlier copy, before any SSH read."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    class NoSession:
        def run(self, host, command):  # noqa: ANN001, ANN202
            raise AssertionError("read from the head although a copy was here")
    session = NoSession()
    assert head_tokenizer.for_target(session, {"hf_model": "org/m"}, "mine.json") is None  # type: ignore[arg-type]
    assert head_tokenizer.for_target(session, {}, None) is None  # type: ignore[arg-type]
    copy = head_tokenizer.local_copy("org/m")
    copy.parent.mkdir(parents=True)
    copy.write_text("{}")
    assert head_tokenizer.for_target(session, {"hf_model": "org/m"}, None) == copy  # type: ignore[arg-type]
