"""`top` behind vLLM's router (issue 40): each replica's own /metrics, read from two real HTTP servers on loopback
serving real vLLM 0.32 captures in turn (so each interval has tokens and new histogram counts), one row per replica
plus their total; a replica that stops answering is named while the other goes on."""

from __future__ import annotations

import http.server
import json
import socket
import time
from collections.abc import Iterator

import pytest
from rich.console import Console

from sparkcluster.engine.inventory import Host
from sparkcluster.observe import replicas as replicas_module
from sparkcluster.observe.replicas import ReplicaTarget
from sparkcluster.observe.top import Source, line, render, watch
from sparkcluster.serving.layout import Placement
from sparkcluster.serving.record import Serving
from sparkcluster.serving.top import replica_targets
from tests.support.metrics import CAPTURES, busier, metrics_server


@pytest.fixture
def two_replicas() -> Iterator[tuple[list[ReplicaTarget], http.server.ThreadingHTTPServer]]:
    with metrics_server(CAPTURES) as (first, _), metrics_server([busier(c) for c in CAPTURES]) as (second, server):
        yield [ReplicaTarget(0, ("spark-1",), first), ReplicaTarget(1, ("spark-2",), second)], server


def once_json(source: Source, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = watch(source, 0.2, once=True, as_json=True, view=Console())
    return code, json.loads(capsys.readouterr().out)


def cells(table_text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is `first`."""
    row = next(r for r in table_text.splitlines() if r.strip("│ ").startswith(first))
    return [c.strip() for c in row.strip().strip("│").split("│")]


def test_each_replica_is_scraped_and_the_total_sums_what_adds_up(two_replicas, capsys):
    targets, _ = two_replicas
    source = Source("http://10.0.0.1:8000/metrics", None, "native", None, targets)
    try:
        code, doc = once_json(source, capsys)
    finally:
        source.close()
    assert code == 0, doc
    first, second = doc["replicas"]
    assert [(r["name"], r["index"], r["nodes"], r["metrics_url"], r["error"]) for r in doc["replicas"]] == [
        ("spark-1", 0, ["spark-1"], targets[0].metrics_url, None), ("spark-2", 1, ["spark-2"], targets[1].metrics_url, None)]
    a, b, total = first["figures"], second["figures"], doc["endpoint"]["figures"]
    assert (a["running"], a["waiting"], a["preemptions"]) == (8, 0, 0) and (b["running"], b["waiting"], b["preemptions"]) == (3, 2, 4)
    assert (total["running"], total["waiting"], total["preemptions"]) == (11, 2, 4)
    assert a["generation_tokens_per_s"] > 0 and b["generation_tokens_per_s"] > 0  # each over its own interval
    assert total["generation_tokens_per_s"] == pytest.approx(a["generation_tokens_per_s"] + b["generation_tokens_per_s"])
    assert total["prompt_tokens_per_s"] == pytest.approx(a["prompt_tokens_per_s"] + b["prompt_tokens_per_s"])
    # latency quantiles stay each replica's own: the total has none, each replica its interval's
    assert a["ttft_p50_s"] is not None and b["itl_p90_s"] is not None
    assert (total["ttft_p50_s"], total["itl_p90_s"], total["kv_cache_usage"]) == (None, None, None)
    assert doc["endpoint"]["metrics_url"] == "http://10.0.0.1:8000/metrics"
    assert doc["endpoint"]["summed_from"] == ["spark-1", "spark-2"] and doc["endpoint"]["error"] is None


def test_a_replica_that_stops_answering_is_named_while_the_other_is_shown(two_replicas, capsys):
    targets, second_server = two_replicas
    source = Source("http://10.0.0.1:8000/metrics", None, "native", None, targets)
    try:
        both = source.read()
        assert [r.error for r in both.replicas] == [None, None] and both.complete
        second_server.shutdown()
        second_server.server_close()
        code, doc = once_json(source, capsys)
        sample = source.read()
    finally:
        source.close()
    assert code == 1  # not everything answered, as for a node
    alive, dead = doc["replicas"]
    assert alive["error"] is None and alive["figures"]["running"] == 8
    assert dead["name"] == "spark-2" and dead["figures"] is None and "did not answer" in dead["error"], dead
    assert doc["endpoint"]["summed_from"] == ["spark-1"] and doc["endpoint"]["figures"]["running"] == 8
    console = Console(width=200, record=True, color_system=None)
    console.print(render(sample, 0.2))
    text = console.export_text()
    assert "2 replicas behind the router" in text and "total (1 of 2)" in text, text
    assert cells(text, "replica 1 on spark-2")[1] == "not answering"
    assert "replica 1 on spark-2: /metrics did not answer: " in text  # why, under the table
    assert cells(text, "replica 0 on spark-1")[1:3] == ["8", "0"]  # running, waiting
    assert cells(text, "total (1 of 2)")[1:4] == ["8", "0", "-"]  # the sum; KV cache is each replica's own
    plain = line(sample)
    assert "total of 1/2 replicas: running 8, waiting 0" in plain and "replica 1 on spark-2: not answering (" in plain


def test_no_replica_answering_leaves_the_endpoint_without_figures():
    with metrics_server(CAPTURES) as (url, server):
        server.shutdown()
        server.server_close()
        source = Source("http://10.0.0.1:8000/metrics", None, "native", None, [ReplicaTarget(0, ("spark-1",), url)])
        try:
            sample = source.read()
        finally:
            source.close()
    assert sample.endpoint is not None and sample.endpoint.error == "no replica's /metrics answered"
    assert sample.to_json()["endpoint"]["summed_from"] == [] and not sample.complete
    assert "total of 0/1 replicas: no replica's /metrics answered" in line(sample)


def test_a_hung_replica_is_shown_within_the_bound_and_not_asked_again_meanwhile(two_replicas, monkeypatch):
    """A replica whose /metrics accepts and never answers: the view returns at the bound, the other replica shown,
    and the hung GET is not repeated while it runs."""
    targets, _ = two_replicas
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # the kernel accepts the connection; nothing ever reads or answers it
    monkeypatch.setattr(replicas_module, "WAIT_S", 0.3)  # the wait's bound; the GET's own stays 5 s
    stuck = ReplicaTarget(1, ("spark-2",), f"http://127.0.0.1:{hung.getsockname()[1]}/metrics")
    source = Source("http://10.0.0.1:8000/metrics", None, "native", None, [targets[0], stuck])
    try:
        started = time.monotonic()
        first = source.read()
        waited = time.monotonic() - started
        pending = source.scraper.in_flight[1] if source.scraper else None
        second = source.read()
        assert source.scraper is not None and source.scraper.in_flight.get(1) is pending  # the same GET, not a new one
    finally:
        source.close()
        hung.close()
    assert waited < 1, waited  # the GET's own bound (5 s) is not waited out
    assert [r.error for r in first.replicas] == [None, "/metrics did not answer within 0.3 s"]
    assert second.replicas[0].figures is not None and second.replicas[1].error == "/metrics did not answer within 0.3 s"


def test_the_records_replicas_are_scraped_where_each_answers_itself():
    hosts = [Host("spark-1", "192.168.1.10", "head"), Host("spark-2", "192.168.1.11", "worker")]
    one_engine = Serving("m", "m", 8000, "http://192.168.1.10:8000/v1", 2)
    assert replica_targets(hosts, one_engine) == () and replica_targets(hosts, None) == ()
    routed = Serving("m", "m", 8000, "http://192.168.1.10:8000/v1", 1,
                     replicas=(Placement(0, ("spark-1",), 8001), Placement(1, ("spark-2",), 8002)))
    assert replica_targets(hosts, routed) == (
        ReplicaTarget(0, ("spark-1",), "http://192.168.1.10:8001/metrics"),
        ReplicaTarget(1, ("spark-2",), "http://192.168.1.11:8002/metrics"))
    assert replica_targets(hosts[1:], routed) == (ReplicaTarget(1, ("spark-2",), "http://192.168.1.11:8002/metrics"),)


def test_a_figure_one_replica_lacks_leaves_the_total_unknown():
    # Failed before: the replica back from a restart (no rate yet) was left out of the sum, which still read as the
    # whole endpoint's.
    from sparkcluster.observe.scrape import EndpointFigures, summed

    steady = EndpointFigures(running=2.0, waiting=0.0, generation_tokens_per_s=40.0, preemptions=1.0, interval_s=1.0)
    restarted = EndpointFigures(running=1.0, waiting=0.0, generation_tokens_per_s=None, preemptions=None)
    total = summed([steady, restarted])
    assert (total.running, total.waiting) == (3.0, 0.0)
    assert total.generation_tokens_per_s is None and total.preemptions is None
    assert summed([steady, steady]).generation_tokens_per_s == 80.0
