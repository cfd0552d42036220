"""`bench --layouts` gives each layout it measures the receipt `bench` gives a result: that layout's serve record and
command line, the /metrics deltas over its own sweep, the nodes' facts read once per run; the resume state keeps the
receipts (a resumed run keeps those of the layouts measured before it), and `bench --explain DIR/layouts.json:tp
DIR/layouts.json:replicas` lines up two layouts, the layout they differ in named first."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import aiohttp
import pytest

from sparkcluster import cli
from sparkcluster.bench import cli as bench_cli
from sparkcluster.bench.cli import cmd_bench
from sparkcluster.bench.explain.facts import Cause
from sparkcluster.bench.explain.lineup import explain
from sparkcluster.bench.explain.sides import sides
from sparkcluster.bench.layouts import methods as layouts_methods
from sparkcluster.bench.layouts import report, run, state
from sparkcluster.bench.layouts.run import Planned, Swept, measure_layouts
from sparkcluster.bench.methods.closed_loop import cli as closed_loop_cli
from sparkcluster.bench.methods.closed_loop.sweep import Level
from sparkcluster.bench.receipt import BenchParams, Engine, NodeReceipt, Receipt
from sparkcluster.bench.receipt_metrics import EngineDeltas, Snapshot, between, snapshot_engines
from sparkcluster.bench.receipt_sources import NodesRead, Served
from sparkcluster.bench.target import Target, engine_metrics
from sparkcluster.engine.errors import SparkclusterError
from sparkcluster.engine.inventory import Host
from sparkcluster.observe.prometheus import parse
from sparkcluster.serving.layout import Placement
from sparkcluster.serving.record import Launched, ServeRecord, Serving
from tests.support.bench import corpus
from tests.support.bench_layouts import INPUTS, TP2, TWO_REPLICAS, inventory_file, measured, on_cluster, planned, row
from tests.support.bench_layouts import Cluster as ServingCluster
from tests.support.openai_stub import running_stub

MODEL = "local/tiny-llama"
TP_COMMAND = ("vllm", "serve", MODEL, "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray",
              "--host", "0.0.0.0", "--port", "8000", "--max-model-len", "256")
REPLICA_COMMAND = ("vllm", "serve", MODEL, "--tensor-parallel-size", "1", "--host", "0.0.0.0", "--port", "8001",
                   "--max-model-len", "256")
NODES = (NodeReceipt("spark-1", "6.17.0", "580.95.05"), NodeReceipt("spark-2", "6.17.0", "580.95.05"))
COMM_ENV = {"spark-1": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"}, "spark-2": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"}}


def receipt(command: tuple[str, ...], tp: int, replicas: int, hit_rate: float = 0.0,
            created: str = "2026-11-27T19:00:00+00:00") -> Receipt:
    return Receipt("http://10.0.0.1:8000/v1",
                   Engine("0.32.0+cpu", command, "host", "native", python_env="/opt/vllm-env", tp=tp, pp=1,
                          replicas=replicas),
                   BenchParams("sustained", {"concurrency": [1], "prompt_tokens": 16, "output_tokens": 16}, "ab" * 32),
                   COMM_ENV, NODES, EngineDeltas(False, None, hit_rate, 0.0, 12.0), created=created)


TP_RECEIPT = receipt(TP_COMMAND, 2, 1, hit_rate=0.5)
REPLICAS_RECEIPT = receipt(REPLICA_COMMAND, 1, 2, hit_rate=0.1)


def with_receipt(kind: str, found: Receipt | None) -> state.Measured:
    layout = {"tp": TP2, "replicas": TWO_REPLICAS}[kind]
    return dataclasses.replace(measured(kind, layout, [row(1, 40.0, 0.05, 0.02)], "0.32.0+cpu"), receipt=found)


# ---- the resume state keeps each layout's receipt ------------------------------------------------------------------

def test_the_state_keeps_each_layouts_receipt_and_reads_it_back_the_same(tmp_path):
    path = tmp_path / state.STATE_FILE
    tp = with_receipt("tp", TP_RECEIPT)
    state.load(path, INPUTS).record(tp)
    doc = json.loads(path.read_text())
    assert doc["version"] == 2
    (entry,) = doc["done"]
    assert entry["receipt"]["engine"]["command"] == list(TP_COMMAND)
    assert entry["receipt"]["metrics"]["prefix_cache_hit_rate"] == 0.5
    assert state.load(path, INPUTS).done == {"tp": tp}  # the receipt reads back equal, field by field


def test_a_state_an_earlier_sparkcluster_wrote_resumes_with_its_receipts_unknown(tmp_path):
    path = tmp_path / state.STATE_FILE
    entry = with_receipt("tp", None).to_json()
    del entry["receipt"]
    path.write_text(json.dumps({"version": 1, "inputs": INPUTS, "done": [entry]}))
    (tp,) = state.load(path, INPUTS).done.values()
    assert tp.receipt is None and tp.rows == (row(1, 40.0, 0.05, 0.02),)


class Cluster(ServingCluster):
    """test_bench_layouts' cluster, whose each measurement's receipt names what was served."""

    def __init__(self, fail_on: str | None = None, created: str = "2026-11-27T19:00:00+00:00") -> None:
        super().__init__(fail_on)
        self.created = created

    def measure(self, item: Planned) -> Swept:
        command, tp, replicas = (TP_COMMAND, 2, 1) if item.kind == "tp" else (REPLICA_COMMAND, 1, 2)
        return dataclasses.replace(super().measure(item), receipt=receipt(command, tp, replicas, created=self.created))


def test_a_resumed_run_keeps_the_receipts_of_the_layouts_measured_before_it(tmp_path):
    path = tmp_path / state.STATE_FILE
    layouts = planned("tp", "replicas")
    first = Cluster(fail_on="replicas", created="2026-11-27T19:00:00+00:00")
    with pytest.raises(SparkclusterError):
        measure_layouts(layouts, state.load(path, INPUTS), first.serve, first.measure, lambda text: None)

    again = Cluster(created="2026-11-27T20:00:00+00:00")
    resumed = state.load(path, INPUTS)
    measure_layouts(layouts, resumed, again.serve, again.measure, lambda text: None)
    assert again.served == ["replicas"]
    tp, replicas = resumed.done["tp"].receipt, resumed.done["replicas"].receipt
    assert tp is not None and replicas is not None
    assert (tp.created, tp.engine.command) == ("2026-11-27T19:00:00+00:00", TP_COMMAND)  # the first run's
    assert (replicas.created, replicas.engine.command) == ("2026-11-27T20:00:00+00:00", REPLICA_COMMAND)
    doc = report.document(list(resumed.done.values()), {"model": MODEL}, 0.0)
    assert [(e["layout"], e["receipt"]["engine"]["tp"], e["receipt"]["engine"]["replicas"])
            for e in doc["layouts"]] == [("tp", 2, 1), ("replicas", 1, 2)]
    assert state.load(path, INPUTS).done == resumed.done


# ---- the receipt of each layout's own measurement --------------------------------------------------------------------

def record(command: tuple[str, ...], tp: int, replicas: tuple[Placement, ...]) -> ServeRecord:
    return ServeRecord("host", "native", "", ("spark-1", "spark-2"),
                       Serving(MODEL, MODEL, 8000, "http://10.0.0.1:8000/v1", tp, replicas=replicas,
                               launched=Launched(command, None, None, ())))


REPLICA_METRICS = ("http://10.0.0.1:8001/metrics", "http://10.0.0.2:8002/metrics")


def metrics(hits: float, queries: float) -> str:
    return f"vllm:prefix_cache_hits_total {hits}\nvllm:prefix_cache_queries_total {queries}\n"


def test_each_layout_gets_its_own_serve_record_and_metrics_and_the_nodes_are_read_once(monkeypatch):
    """The record is read after each layout's serve; /metrics over each layout's own sweep; the nodes' facts from
    the first layout's reading are handed to every later one (no serve changes them)."""
    served = {"tp": record(TP_COMMAND, 2, ()),
              "replicas": record(REPLICA_COMMAND, 1, (Placement(0, ("spark-1",), 8001),
                                                      Placement(1, ("spark-2",), 8002)))}
    now: list[str] = []
    given_nodes: list[NodesRead | None] = []
    read_from: list[tuple[str, ...]] = []

    def from_cluster(session: object, nodes: NodesRead | None = None) -> Target:
        given_nodes.append(nodes)
        found = nodes or NodesRead(COMM_ENV, NODES)
        return Target("http://10.0.0.1:8000/v1", MODEL, served=Served(
            served[now[-1]], None, "0.32.0+cpu", None, "/opt/vllm-env", found.comm_env, found.nodes),
            engine_metrics=REPLICA_METRICS if now[-1] == "replicas" else ())

    async def sweep(base_url, model, options, levels, prepared, emit, api_key, engine_metrics):  # noqa: ANN001, ANN202
        read_from.append(engine_metrics)
        hits = {"tp": 30.0, "replicas": 10.0}[now[-1]]  # this layout's cache hits over its own sweep
        prepared.prompt_words, prepared.prompt_tokens = 12, 16
        prepared.metrics_before = Snapshot(1.0, parse(metrics(100.0, 200.0)))
        prepared.metrics_after = Snapshot(5.0, parse(metrics(100.0 + hits, 260.0)))
        levels.append(Level(row(1, 40.0, 0.05, 0.02), None))

    monkeypatch.setattr(run, "from_cluster", from_cluster)
    monkeypatch.setattr(closed_loop_cli, "sweep", sweep)
    args = cli.build_parser(["bench"]).parse_args(["bench", "--layouts", "tp,replicas", "--concurrency", "1", "--json"])
    method = layouts_methods.Sustained()
    measure = run.measure_on(object(), method, method.plan(args), args)  # type: ignore[arg-type]
    swept = {}
    for item in planned("tp", "replicas"):
        now.append(item.kind)
        swept[item.kind] = measure(item)

    assert given_nodes == [None, NodesRead(COMM_ENV, NODES)]  # read with tp's, handed to replicas'
    assert read_from == [(), REPLICA_METRICS]  # behind the router, each replica's own /metrics
    tp, replicas = swept["tp"].receipt, swept["replicas"].receipt
    assert tp is not None and replicas is not None
    assert tp.engine.command == TP_COMMAND and (tp.engine.tp, tp.engine.replicas) == (2, 1)
    assert replicas.engine.command == REPLICA_COMMAND and (replicas.engine.tp, replicas.engine.replicas) == (1, 2)
    assert tp.metrics is not None and tp.metrics.prefix_cache_hit_rate == 0.5 and tp.metrics.interval_s == 4.0
    assert replicas.metrics is not None and replicas.metrics.prefix_cache_hit_rate == pytest.approx(1 / 6)
    assert tp.nodes == replicas.nodes == NODES and tp.comm_env == COMM_ENV
    assert tp.engine.vllm_version == "0.32.0+cpu" and swept["tp"].vllm_build == "0.32.0+cpu"
    assert tp.bench.method == "sustained" and tp.bench.parameters["prompt_tokens_measured"] == 16
    assert tp.bench.prompt_digest  # the same prompt set as `bench` names it


# ---- behind the router: each replica's own /metrics, summed ------------------------------------------------------

def test_behind_a_router_the_receipt_reads_each_replicas_own_metrics():
    routed = Serving(MODEL, MODEL, 8000, "http://192.168.1.10:8000/v1", 1,
                     replicas=(Placement(0, ("spark-1",), 8001), Placement(1, ("spark-2",), 8002)))
    hosts = [Host("spark-1", "192.168.1.10", "head"), Host("spark-2", "192.168.1.11", "worker")]
    assert engine_metrics(hosts, routed) == ("http://192.168.1.10:8001/metrics", "http://192.168.1.11:8002/metrics")
    assert engine_metrics(hosts, dataclasses.replace(routed, replicas=())) == ()  # one engine: the endpoint's own


async def _complete(client: aiohttp.ClientSession, base_url: str, max_tokens: int) -> None:
    async with client.post(f"{base_url}/completions", json={"prompt": "one two three", "max_tokens": max_tokens}) as r:
        assert r.status == 200


def test_the_replicas_counters_are_summed_and_one_that_does_not_answer_leaves_them_unknown():
    """vllm-router hands its /metrics to one replica in turn: the deltas are each replica's own, summed."""
    with running_stub(spec_tokens=2) as a, running_stub(spec_tokens=4) as b:
        urls = [a.removesuffix("/v1") + "/metrics", b.removesuffix("/v1") + "/metrics"]

        async def measure(engines: list[str]) -> EngineDeltas | None:
            async with aiohttp.ClientSession() as client:
                before = await snapshot_engines(client, engines)
                for base_url, max_tokens in ((a, 8), (a, 8), (b, 8)):  # 4 drafts per request of 8 tokens
                    await _complete(client, base_url, max_tokens)
                return between(before, await snapshot_engines(client, engines))

        summed = asyncio.run(measure(urls))
        assert summed is not None and summed.spec_decode is not None, summed
        assert (summed.spec_decode.drafts, summed.spec_decode.draft_tokens) == (12, 2 * 4 * 2 + 4 * 4)
        assert summed.spec_decode.acceptance_rate == 12 / 32 and summed.prefix_cache_hit_rate == 0.0
        assert asyncio.run(measure([*urls, "http://127.0.0.1:9/metrics"])) is None  # a replica not answering


def test_bench_on_a_routed_serve_reads_the_replicas_metrics_too(monkeypatch, capsys):
    """Plain `bench` on a serve behind the router: the endpoint answers the requests, the receipt's deltas come from
    the replicas' own /metrics (here only the second engine speculates, so only its counters can say so)."""
    with running_stub() as endpoint, running_stub(spec_tokens=2) as other:
        replicas = (endpoint.removesuffix("/v1") + "/metrics", other.removesuffix("/v1") + "/metrics")
        monkeypatch.setattr(bench_cli, "find_target", lambda args, connect, tokenizer=False: (
            Target(endpoint, None, engine_metrics=replicas), None))
        args = cli.build_parser(["bench"]).parse_args(["bench", "--url", endpoint, "--json", "--concurrency", "1",
                                                       "--runs", "1", "--requests-per-stream", "1", "--warmup", "0",
                                                       "--prompt-tokens", "16", "--output-tokens", "8"])
        assert cmd_bench(args, None) == 0  # type: ignore[arg-type]
    found = json.loads(capsys.readouterr().out)["receipt"]["metrics"]
    assert found["speculative"] is True and found["spec_decode"]["drafts"] == 0, found  # read, idle over the run


def test_llama_benchy_on_a_routed_serve_reads_the_replicas_metrics_too(tmp_path, monkeypatch, capsys):
    with running_stub() as endpoint, running_stub(spec_tokens=2) as other:
        replicas = (endpoint.removesuffix("/v1") + "/metrics", other.removesuffix("/v1") + "/metrics")
        monkeypatch.setattr(bench_cli, "find_target", lambda args, connect, tokenizer=False: (
            Target(endpoint, None, engine_metrics=replicas), None))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setenv("HOME", str(tmp_path))
        args = cli.build_parser(["bench"]).parse_args(["bench", "--url", endpoint, "--method", "llama-benchy",
                                                       "--corpus", str(corpus(tmp_path)), "--pp", "32", "--tg", "4",
                                                       "--runs", "1", "--no-warmup", "--json"])
        assert cmd_bench(args, None) == 0  # type: ignore[arg-type]
    found = json.loads(capsys.readouterr().out)["sparkcluster"]["receipt"]["metrics"]
    assert found["speculative"] is True and found["spec_decode"]["drafts"] == 0, found


# ---- --explain between two layouts ----------------------------------------------------------------------------------

def layouts_result(tmp_path: Path, tp: Receipt | None = TP_RECEIPT) -> Path:
    path = tmp_path / "layouts.json"
    doc = report.document([with_receipt("tp", tp), with_receipt("replicas", REPLICAS_RECEIPT)], {"model": MODEL}, 0.0)
    path.write_text(json.dumps(doc))
    return path


def test_explain_between_two_layouts_names_the_layout_first_then_the_command_lines_parallelism(tmp_path, capsys):
    path = layouts_result(tmp_path)
    found = explain(*sides([f"{path}:tp", f"{path}:replicas"], None))
    keys = [d.key for d in found.differences]
    # The prefix cache's hit rate (an engine flag's effect, ranked above the layout between two results) comes after.
    assert keys == ["layout", "--tensor-parallel-size", "--distributed-executor-backend", "tp", "replicas",
                    "prefix-cache hit rate", "--port"], keys
    layout = found.differences[0]
    assert (layout.a, layout.b, layout.cause) == ("tp (TP 2 x PP 1)", "replicas (2 replicas of TP 1 x PP 1 behind a "
                                                  "router)", Cause.LAYOUT)
    assert [(d.a, d.b) for d in found.differences[1:3]] == [("2", "1"), ("ray", "not set")]

    assert cli.main(["bench", "--explain", f"{path}:tp", f"{path}:replicas"]) == 0
    out = capsys.readouterr().out
    assert f"A: {path}:tp\nB: {path}:replicas\n" in out
    assert ("  1. layout: A tp (TP 2 x PP 1), B replicas (2 replicas of TP 1 x PP 1 behind a router)  [model and "
            "layout]") in out, out
    assert "  2. --tensor-parallel-size: A 2, B 1  [model and layout]" in out, out
    assert "c=1  generation tok/s  40.0 -> 40.0  (100%)" in out, out


def test_a_layout_against_a_bench_result_lines_up_the_receipts_alone(tmp_path):
    path = layouts_result(tmp_path)
    plain = tmp_path / "bench.json"
    plain.write_text(json.dumps({"config": {}, "rows": [row(1, 30.0, 0.05, 0.02).to_json()],
                                 "receipt": REPLICAS_RECEIPT.to_json()}))
    found = explain(*sides([f"{path}:tp", str(plain)], None))
    keys = [d.key for d in found.differences]
    assert keys == ["prefix-cache hit rate", "tp", "replicas", "--port"], keys  # the usual ranking
    assert "layout" not in found.same and "--tensor-parallel-size" not in found.same


@pytest.mark.parametrize("name, said, fix", [
    ("{path}", "is a `bench --layouts` result (layouts tp, replicas): it needs the layout named",
     "e.g. --explain {path}:tp {path}:replicas"),
    ("{path}:pp", "{path} holds no layout pp (it holds tp, replicas)", "name a layout it holds"),
    ("{plain}:tp", "{plain} is not a `bench --layouts` result, so it holds no layout tp",
     "give the file alone (--explain {plain} ...)"),
    ("{unmeasured}:tp", "layout tp was measured without a receipt", "measure it again"),
])
def test_a_layout_not_named_not_held_or_without_a_receipt_is_refused_with_the_fix(tmp_path, capsys, name, said, fix):
    path = layouts_result(tmp_path)
    (tmp_path / "old").mkdir()
    unmeasured = layouts_result(tmp_path / "old", tp=None)
    plain = tmp_path / "bench.json"
    plain.write_text(json.dumps({"config": {}, "rows": [], "receipt": REPLICAS_RECEIPT.to_json()}))
    names = {"path": path, "plain": plain, "unmeasured": unmeasured}
    code = cli.main(["bench", "--explain", name.format(**names), f"{path}:replicas"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert said.format(**names) in err and fix.format(**names) in err, err


# ---- the text says where the receipts are ---------------------------------------------------------------------------

def test_the_text_says_where_each_layouts_receipt_is_and_how_to_explain_two(tmp_path, capsys, monkeypatch):
    cluster = Cluster()
    connect = on_cluster(monkeypatch, cluster, staged_s=0.0)
    out = tmp_path / "out"
    args = cli.build_parser(["bench"]).parse_args(["bench", "-i", str(inventory_file(tmp_path, 2)), "--layouts",
                                                   "tp,replicas", "--model", MODEL, "--concurrency", "1", "--out",
                                                   str(out)])
    args.remote = []
    assert cmd_bench(args, connect) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (f"results, each layout with the receipt of its measurement: {out / 'layouts.json'}; the resume state: "
            f"{out / 'layouts-state.json'}") in text, text
    assert (f"why two layouts' figures differ: sparkcluster bench --explain {out / 'layouts.json'}:tp "
            f"{out / 'layouts.json'}:replicas") in text, text
    entries = json.loads((out / "layouts.json").read_text())["layouts"]
    assert [e["receipt"]["engine"]["command"] for e in entries] == [list(TP_COMMAND), list(REPLICA_COMMAND)]
