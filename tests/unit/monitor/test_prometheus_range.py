"""`status`, `top` and `bench` read the endpoint's figures from the cluster's Prometheus where `monitor up` runs it
(observe/promrange.py): found by the pid and args files `monitor up` leaves at its place, asked with one shell line
there, against the distribution's real Prometheus on loopback scraping a stub vLLM /metrics (a real 0.32 capture
whose counters and histogram buckets grow by the capture's own values each scrape, so every window holds the
capture's figures per scrape). Where Prometheus does not run or does not answer, there is no range: callers keep
reading /metrics as before."""

from __future__ import annotations

import argparse
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sparkcluster.bench import alongside
from sparkcluster.engine.cliapp import Connect
from sparkcluster.engine.command import Command
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Result
from sparkcluster.monitor import deploy
from sparkcluster.monitor.config import prometheus_config
from sparkcluster.monitor.place import LocalPlace
from sparkcluster.monitor.targets import Target, Targets
from sparkcluster.observe import promrange
from sparkcluster.observe.prometheus import parse
from sparkcluster.observe.promrange import PrometheusRange, ask, find, read_answer
from sparkcluster.observe.scrape import ITL, TTFT, EndpointFigures
from sparkcluster.observe.top import Source, line
from sparkcluster.serving.render import status_table
from sparkcluster.serving.status import ClusterStatus, ServerStatus
from tests.support.monitor import VLLM, free_port

GROWING = re.compile(r"^(vllm:\S+_(?:total|bucket|count|sum)(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)
live = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                          reason="Prometheus missing: apt-get install prometheus")


class GrowingVllm(BaseHTTPRequestHandler):
    """Each scrape adds the capture's own counter and bucket values once more: a steady load."""

    scrapes = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        GrowingVllm.scrapes += 1
        n = GrowingVllm.scrapes
        body = GROWING.sub(lambda m: f"{m[1]} {float(m[2]) * n}", VLLM).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass


@pytest.fixture
def vllm() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), GrowingVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("HOME", str(tmp_path))
    yield tmp_path
    deploy.stop(LocalPlace(), "prometheus", purge=True)


CAPTURE = parse(VLLM)


class Here:
    """A head that is this machine: each command's shell line run locally, from HOME (as ssh runs it)."""

    def run(self, command: Command) -> Result:
        code, stdout = promrange.run_here(command.script)
        return Result(command, code, stdout, "", 0.01)

    def close(self) -> None:
        pass


def head_here(name: str) -> Connect:
    @contextmanager
    def connect(args: Any, check: Any, require_all: bool = True) -> Iterator[Session]:
        head = Host(name=name, address="127.0.0.1", role="head")
        with Session(Inventory(path=Path("inv.yml"), name="t", hosts=(head,), vars={}), {name: Here()}) as session:
            yield session
    return connect  # type: ignore[return-value]


@live
def test_the_range_prometheus_saw_is_the_endpoints_figures(home: Path, vllm: str) -> None:
    assert find(None, None) is None  # nothing started here yet: no range, /metrics as before
    listen = f"127.0.0.1:{free_port()}"
    targets = Targets((), (Target("vllm", vllm, (("node", "spark-1"), ("replica", "vLLM"), ("model", "tiny"))),))
    up = deploy.prometheus_up(LocalPlace(), {"prometheus.yml": prometheus_config(targets, [], interval_s=1).encode()},
                              listen, check=False)
    assert up.status == "changed", up
    deadline = time.monotonic() + 60
    seen: PrometheusRange | None = None
    while time.monotonic() < deadline:  # a rate needs two scrapes in the window, a steady one a few more
        seen = find(None, None, window_s=6)
        if seen is not None and GrowingVllm.scrapes >= 8:
            break
        time.sleep(1)
    assert seen is not None, "Prometheus on this machine gave no range within 60 s"
    assert (seen.place, seen.listen, seen.window_s) == ("this machine", listen, 6)
    assert seen.said() == "from Prometheus on this machine, last 6 s"
    assert seen.source() == {"from": "prometheus", "place": "this machine", "listen": listen, "window_s": 6}
    f = seen.figures
    per_scrape = CAPTURE.total("vllm:generation_tokens_total")
    assert per_scrape and f.generation_tokens_per_s is not None
    assert 0.7 * per_scrape < f.generation_tokens_per_s < 1.3 * per_scrape  # one scrape's worth a second
    prompt = CAPTURE.total("vllm:prompt_tokens_total")
    assert prompt and f.prompt_tokens_per_s is not None and 0.7 * prompt < f.prompt_tokens_per_s < 1.3 * prompt
    assert f.running == 8 and f.waiting == 0  # the capture's gauges, averaged over the window
    assert f.kv_cache_usage == pytest.approx(CAPTURE.first("vllm:kv_cache_usage_perc"))
    assert f.prefix_cache_hit_rate == 0  # 0 hits of 140 queries a scrape
    # each window's buckets are the capture's: Prometheus' quantile is the one observe reads from the capture
    ttft, itl = CAPTURE.histogram(TTFT[0]), CAPTURE.histogram(ITL[0])
    assert ttft is not None and itl is not None
    assert f.ttft_p50_s == pytest.approx(ttft.quantile(0.5), rel=1e-6)
    assert f.ttft_p90_s == pytest.approx(ttft.quantile(0.9), rel=1e-6)
    assert f.itl_p50_s == pytest.approx(itl.quantile(0.5), rel=1e-6)
    assert f.itl_p90_s == pytest.approx(itl.quantile(0.9), rel=1e-6)
    assert f.interval_s == 6 and not f.since_start

    # bench: the same range over the run's seconds, asked on the head (here: this machine as spark-1, over a
    # transport that runs the shell line locally) over the connection that reads the GPUs as the run ends
    extra = alongside.gather(argparse.Namespace(url=None), head_here("spark-1"), {}, [], 0, run_s=4.2)
    seen_by_bench = extra.prometheus
    assert seen_by_bench is not None and (seen_by_bench.place, seen_by_bench.window_s) == ("spark-1", 30)
    assert seen_by_bench.figures.generation_tokens_per_s and seen_by_bench.figures.generation_tokens_per_s > 0
    doc = extra.to_json()["prometheus"]
    assert doc["source"] == {"from": "prometheus", "place": "spark-1", "listen": listen, "window_s": 30}
    assert doc["figures"]["generation_tokens_per_s"] == seen_by_bench.figures.generation_tokens_per_s
    said = extra.prometheus_line()
    assert said is not None and said.startswith("Prometheus on spark-1 during the run (last 30 s): running 8, ")

    deploy.stop(LocalPlace(), "prometheus", purge=False)
    assert find(None, None) is None  # stopped: its pid file is gone, nothing is asked
    quiet = alongside.gather(argparse.Namespace(url=None), head_here("spark-1"), {}, [], 0, run_s=4.2)
    assert quiet.prometheus is None and "prometheus" not in quiet.to_json() and quiet.prometheus_line() is None


@live
def test_a_prometheus_without_vllm_series_gives_no_range(home: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    silent = Targets((), (Target("vllm", f"127.0.0.1:{free_port()}", (("node", "spark-1"),)),))  # nothing answers
    deploy.prometheus_up(LocalPlace(), {"prometheus.yml": prometheus_config(silent, [], interval_s=1).encode()},
                         listen, check=False)
    code, stdout = promrange.run_here(promrange.ask_script())
    assert code == 0 and f'"listen": "{listen}"' in stdout  # it runs and answers...
    assert find(None, None) is None  # ...but has no engine's figures: /metrics it is


def test_no_answer_is_no_range() -> None:
    assert ask("spark-1", lambda script: (3, "")) is None  # not running there
    assert ask("spark-1", lambda script: (0, "Traceback (most recent call last)")) is None
    assert read_answer("spark-1", '{"listen": "127.0.0.1:9095", "values": {"generation_tokens_per_s": null}}') is None

    def unreachable(script: str) -> tuple[int, str]:
        raise OSError("connection refused")
    assert ask("spark-1", unreachable) is None
    got = read_answer("spark-1", '{"listen": "127.0.0.1:9095", "values": {"generation_tokens_per_s": 12.5, '
                                 '"ttft_p50_s": NaN, "running": 0.3333333}}')
    assert got is not None and got.figures.generation_tokens_per_s == 12.5 and got.figures.ttft_p50_s is None
    assert got.figures.running == 0.33 and got.figures.waiting is None
    assert got.said() == "from Prometheus on spark-1, last 5 min"


SEEN = PrometheusRange("spark-1", "127.0.0.1:9095", 300, EndpointFigures(running=2, waiting=0,
                       generation_tokens_per_s=41.5, prompt_tokens_per_s=3.0, interval_s=300))


def test_status_says_where_its_figures_come_from() -> None:
    server = ServerStatus("http://10.0.0.1:8000/v1", "m", "m", 200, ("m",), SEEN.figures, prometheus=SEEN)
    console = Console(record=True, width=400)
    status_table(console, ClusterStatus(None, {}, server=server))
    text = console.export_text()
    assert "  from Prometheus on spark-1, last 5 min: running 2, waiting 0, " in text
    assert "generation 41.5 tok/s" in text
    doc = ClusterStatus(None, {}, server=server).to_json()["server"]
    assert doc["source"] == {"from": "prometheus", "place": "spark-1", "listen": "127.0.0.1:9095", "window_s": 300}
    scraped = ClusterStatus(None, {}, server=ServerStatus("http://10.0.0.1:8000/v1", "m", "m", 200, ("m",),
                                                          EndpointFigures(running=1)))
    assert "source" not in scraped.to_json()["server"]  # /metrics' own: the document as before
    console = Console(record=True, width=400)
    status_table(console, scraped)
    assert "Prometheus" not in console.export_text()  # as before: one second of /metrics, no source line


def test_top_reads_prometheus_once_per_its_scrape_and_says_so(vllm: str) -> None:
    asked: list[int] = []

    def prometheus() -> PrometheusRange | None:
        asked.append(1)
        return SEEN
    source = Source(f"http://{vllm}/metrics", None, "ray", None, prometheus=prometheus)
    first, second = source.read(), source.read()
    assert len(asked) == 1  # again only after PROMETHEUS_EVERY_S
    assert first.endpoint is not None and first.endpoint.figures == SEEN.figures
    assert second.to_json()["endpoint"]["source"]["from"] == "prometheus"
    assert "from Prometheus on spark-1, last 5 min: running 2, waiting 0" in line(second)

    plain = Source(f"http://{vllm}/metrics", None, "ray", None, prometheus=lambda: None)
    sample = plain.read()
    assert "source" not in sample.to_json()["endpoint"]
    assert sample.endpoint is not None and sample.endpoint.figures is not None
    assert sample.endpoint.figures.running == 8  # the scrape's own
    assert "Prometheus" not in line(sample)
