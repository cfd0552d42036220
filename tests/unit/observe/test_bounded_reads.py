"""Issue 46, F6 (R10-R12): every HTTP read of status, top and readiness is bounded in time for the whole request and
in bytes (observe/bounded.py), against tests/support/hostile_server.py answering every path with its headers and then a byte a
second (for 120 s: a reader bounded per read waits all of it) or with a body that never ends."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest
from rich.console import Console

from sparkcluster.bench.receipts import endpoint_version
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.observe.bounded import request
from sparkcluster.observe.replicas import ReplicaScraper, ReplicaTarget
from sparkcluster.observe.scrape import SCRAPE_TIMEOUT_S, fetch
from sparkcluster.serving.layout import Layout
from sparkcluster.serving.readiness import http
from sparkcluster.serving.record import Serving
from sparkcluster.serving.render import status_table
from sparkcluster.serving.status import ClusterStatus, ReplicaStatus, ServerStatus, replica_status, server_status
from tests.support.helpers import run_cli
from tests.support.hostile_server import TRICKLE_FOR_S
from tests.support.openai_stub import running_server

T = TypeVar("T")
# Well under TRICKLE_FOR_S: a call that ends only when the trickle does has failed.
MARGIN_S = 10.0


@pytest.fixture(scope="module")
def trickle() -> Iterator[int]:
    with running_server("tests.support.hostile_server", every="trickle") as port:
        yield port


@pytest.fixture(scope="module")
def endless() -> Iterator[int]:
    with running_server("tests.support.hostile_server", every="endless-body") as port:
        yield port


def within(seconds: float, call: Callable[[], T]) -> tuple[T, float]:
    """`call`'s value and how long it took; it must end within `seconds` (waited a little past, not for ever)."""
    assert seconds + MARGIN_S < TRICKLE_FOR_S
    started = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        value = pool.submit(call).result(timeout=seconds + MARGIN_S)
    finally:
        pool.shutdown(wait=False)
    took = time.monotonic() - started
    assert took < seconds + MARGIN_S / 2, took
    return value, took


def test_a_trickle_is_cut_at_the_requests_deadline_not_each_reads(trickle):
    answer, took = within(1.0, lambda: request(f"http://127.0.0.1:{trickle}/health", timeout_s=1.0,
                                               limit_bytes=1 << 20))
    assert (answer.status, answer.error) == (0, "did not answer within 1 s") and 0.9 < took, took


def test_a_body_that_never_ends_is_cut_at_the_cap(endless):
    answer, _ = within(5.0, lambda: request(f"http://127.0.0.1:{endless}/health", timeout_s=5.0, limit_bytes=1 << 20))
    assert (answer.status, answer.body, answer.error) == (0, b"", "sent more than 1 MiB; read no further")
    assert http(f"http://127.0.0.1:{endless}/health") == (0, "")  # serve and status read no more than 1 MiB


def test_a_password_in_the_address_is_sent_as_basic_auth_and_named_in_no_error(endless):
    answer = request(f"http://al%40ice:s3cret@127.0.0.1:{endless}/health", timeout_s=0.5, limit_bytes=16)
    assert answer.error and "s3cret" not in answer.error
    refused = request("http://bob:s3cret@127.0.0.1:1/v1", timeout_s=1.0, limit_bytes=16)
    assert refused.status == 0 and refused.error and "s3cret" not in refused.error


def _session() -> Session:
    hosts = (Host("spark-1", "127.0.0.1", role="head"),)
    return Session(Inventory(path=Path("inv.yml"), name="t", hosts=hosts, vars={}), transports={})


@pytest.mark.parametrize("server", ["trickle", "endless"])
def test_status_ends_within_its_bounds_and_names_the_endpoint_that_did_not_answer(server, request_fixture):
    """R10/R11: `status` against a replica (and an endpoint) whose /health trickles or never ends: each GET within 5
    s and 1 MiB (health, then the model list), the replica and the endpoint named as not answering."""
    port = request_fixture(server)
    placement = replace(Layout(2).place(["spark-1", "spark-2"], 8000)[1], port=port)
    serving = Serving("org/m", "m", port, f"http://127.0.0.1:{port}/v1", 1)
    with ThreadPoolExecutor(max_workers=2) as pool:  # as status does: the endpoint and each replica at once
        def both() -> tuple[ReplicaStatus, ServerStatus]:
            replica = pool.submit(replica_status, placement, "127.0.0.1", {})
            server = pool.submit(server_status, _session(), serving)
            return replica.result(), server.result()
        (replica, server_state), _ = within(10.0, both)
    assert replica.health == 0 and not replica.healthy and replica.figures is None
    assert server_state.health == 0 and server_state.models == () and server_state.figures is None
    out = io.StringIO()
    status_table(Console(file=out, width=300), ClusterStatus(None, {}, server=server_state))
    assert f"not answering m (org/m) at http://127.0.0.1:{port}/v1" in out.getvalue()
    out = io.StringIO()
    status_table(Console(file=out, width=300), ClusterStatus(None, {}, server=server_state, replicas=(replica,)))
    assert f"replica 1 on spark-2 at http://127.0.0.1:{port}/v1: not answering (HTTP none)" in out.getvalue()


@pytest.fixture
def request_fixture(request: pytest.FixtureRequest) -> Callable[[str], int]:
    return lambda name: int(request.getfixturevalue(name))


def test_a_replica_that_trickles_holds_tops_view_one_interval_and_its_get_ends_within_the_bound(trickle):
    """R12: behind a router, the trickling replica's GET ends (as an error naming it) within SCRAPE_TIMEOUT_S."""
    scraper = ReplicaScraper([ReplicaTarget(0, ("spark-1",), f"http://127.0.0.1:{trickle}/metrics")])
    try:
        first = scraper.read()[0]
        assert first.error == "/metrics did not answer within 1 s"  # the view goes on after WAIT_S
        reading, _ = within(SCRAPE_TIMEOUT_S, scraper.in_flight[0].result)
        assert reading.error == f"/metrics did not answer within {SCRAPE_TIMEOUT_S:g} s"
    finally:
        scraper.close()
    alone = fetch(f"http://127.0.0.1:{trickle}/metrics", timeout=0.5)
    assert alone.scrape is None and alone.error == "/metrics did not answer within 0.5 s"


@pytest.mark.parametrize("server, why", [("trickle", f"did not answer within {SCRAPE_TIMEOUT_S:g} s"),
                                         ("endless", "sent more than 8 MiB; read no further")])
def test_top_url_once_ends_within_the_bound_and_names_the_endpoint(server, why, request_fixture):
    """R12: `top --url --once` of an endpoint that trickles (or never ends) its /metrics: its two GETs (the second
    for the rates) each within the 5 s bound, exit 1, the endpoint named with why."""
    port = request_fixture(server)
    started = time.monotonic()
    result = run_cli("top", "--url", f"http://127.0.0.1:{port}/v1", "--once", "--json", timeout=60)
    took = time.monotonic() - started
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    endpoint = json.loads(result.stdout)["endpoint"]
    assert endpoint == {"metrics_url": f"http://127.0.0.1:{port}/metrics", "error": f"/metrics {why}",
                        "figures": None}
    assert took < 2 * SCRAPE_TIMEOUT_S + 15, took  # the CLI's start, and two GETs within their bound


def test_bench_asks_an_endpoints_version_within_the_bound(trickle, endless):
    """`bench --url`'s receipt asks /version (its cap was 4096 bytes, its timeout each read's): None within 5 s."""
    assert within(SCRAPE_TIMEOUT_S, lambda: endpoint_version(f"http://127.0.0.1:{trickle}/v1"))[0] is None
    assert within(SCRAPE_TIMEOUT_S, lambda: endpoint_version(f"http://127.0.0.1:{endless}/v1"))[0] is None
    with running_server("tests.support.hostile_server") as port:  # a healthy /version beside the hostile routes
        assert endpoint_version(f"http://127.0.0.1:{port}/any/v1") == "hostile"
