"""What `sparkcluster top` shows: the served cluster, live. Per node: GPU utilisation and memory, its temperature, power,
SM clock and throttle reasons, Ray and vLLM; for the
endpoint, vLLM's own figures from /metrics over the last interval. Full-screen on a terminal (rich), one line per
interval into a pipe, or one sample as a JSON document (`--once --json`).

It only reads: one /metrics GET and one short shell line per node per interval, nothing sent to the model. A node
or an endpoint that stops answering is shown as such and the view goes on. Behind a router (`serve --replicas N`)
the GET is each replica's own, one row per replica and their total (observe/replicas.py says why). Where
`monitor up` runs Prometheus, the endpoint's figures are its last minutes instead (observe/promrange.py), and say so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..engine.errors import EXIT_FAILED, EXIT_OK
from ..engine.report import print_json
from ..node.gputelemetry import HOT_C, GpuTelemetry
from .endpoint import endpoint_address
from .nodeprobe import MemorySource, NodeSample, NodeSampler
from .promrange import PrometheusRange
from .replicas import ReplicaScraper, ReplicaTarget, ReplicaView
from .scrape import EndpointFigures, Reading, fetch, figures, metrics_url, summed

MIN_INTERVAL_S, MAX_INTERVAL_S = 0.2, 3600.0
PROMETHEUS_EVERY_S = 15.0  # monitor's scrape interval: Prometheus' range changes no faster


@dataclass(frozen=True)
class EndpointView:
    url: str  # the /metrics address
    figures: EndpointFigures | None = None
    error: str | None = None
    summed_from: tuple[str, ...] | None = None  # behind a router: the replicas whose figures these are the sum of
    prometheus: PrometheusRange | None = None  # figures: the cluster's Prometheus over minutes (`monitor up`)

    def to_json(self) -> dict[str, Any]:
        doc = {"metrics_url": self.url, "error": self.error,
               "figures": None if self.figures is None else self.figures.to_json(),
               **({"source": self.prometheus.source()} if self.prometheus else {})}  # absent: /metrics, as before
        return doc if self.summed_from is None else {**doc, "summed_from": list(self.summed_from)}


def replicas_total(url: str, replicas: Sequence[ReplicaView]) -> EndpointView:
    """The endpoint behind a router, as the sum of the replicas that answered."""
    answered = [r for r in replicas if r.figures is not None]
    if not answered:
        return EndpointView(url, error="no replica's /metrics answered", summed_from=())
    return EndpointView(url, summed([r.figures for r in answered if r.figures is not None]),
                        summed_from=tuple(r.target.name for r in answered))


@dataclass(frozen=True)
class TopSample:
    at: float  # unix time
    endpoint: EndpointView | None
    nodes: list[NodeSample] = field(default_factory=list)
    launcher: str = "ray"  # how the nodes serve (ray, native): which processes a node shows
    note: str | None = None  # e.g. nothing served
    replicas: tuple[ReplicaView, ...] = ()  # behind a router (endpoint: their total); empty: one engine

    @property
    def complete(self) -> bool:
        """Everything asked for answered."""
        return (all(n.answered for n in self.nodes) and (self.endpoint is None or self.endpoint.error is None)
                and all(r.error is None for r in self.replicas))

    def to_json(self) -> dict[str, Any]:
        doc = {"time": round(self.at, 3), "launcher": self.launcher, "note": self.note,
               "endpoint": None if self.endpoint is None else self.endpoint.to_json(),
               "nodes": {n.name: n.to_json() for n in self.nodes}}
        return {**doc, "replicas": [r.to_json() for r in self.replicas]} if self.replicas else doc


class Source:
    """What one sample reads: the endpoint's /metrics (where there is one), or behind a router each replica's, and
    the nodes (where connected)."""

    def __init__(self, url: str | None, sampler: NodeSampler | None, launcher: str, note: str | None,
                 replicas: Sequence[ReplicaTarget] = (),
                 prometheus: Callable[[], PrometheusRange | None] | None = None) -> None:
        self.url, self.sampler, self.launcher, self.note = url, sampler, launcher, note
        self.prometheus = prometheus  # asks where `monitor up` runs Prometheus; None: /metrics only
        self.seen: tuple[float, PrometheusRange | None] | None = None  # (monotonic time, its answer)
        self.previous: Reading | None = None
        self.scraper = ReplicaScraper(replicas) if replicas else None

    def read(self) -> TopSample:
        endpoint: EndpointView | None = None
        replicas: tuple[ReplicaView, ...] = ()
        if self.scraper is not None and self.url is not None:
            replicas = self.scraper.read()
            endpoint = replicas_total(self.url, replicas)
        elif self.url is not None:
            reading = fetch(self.url)
            if reading.scrape is None:
                endpoint = EndpointView(self.url, error=reading.error)
            else:
                endpoint = EndpointView(self.url, figures(reading.scrape, self.previous, reading.at))
                self.previous = reading
        seen = self._ask() if endpoint is not None else None
        if endpoint is not None and seen is not None:
            endpoint = replace(endpoint, figures=seen.figures, error=None, prometheus=seen)
        nodes = self.sampler.sample() if self.sampler else []
        return TopSample(time.time(), endpoint, nodes, self.launcher, self.note, replicas)

    def _ask(self) -> PrometheusRange | None:
        """Prometheus' range, asked again once per its scrape interval (a live view every second would otherwise
        cost an SSH round trip a second for figures that change every 15 s)."""
        if self.prometheus is None:
            return None
        now = time.monotonic()
        if self.seen is None or now - self.seen[0] >= PROMETHEUS_EVERY_S:
            self.seen = (now, self.prometheus())
        return self.seen[1]

    def close(self) -> None:
        if self.scraper is not None:
            self.scraper.close()


def url_of(text: str) -> str:
    """--url as given (`host:8000`, `http://host:8000/v1`) -> its /metrics address (endpoint.py: never a user or
    password)."""
    return metrics_url(endpoint_address(text))


# ---- rendering ----------------------------------------------------------------------------------------------
def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:,.1f} GiB"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:,.0f} ms"


def _num(v: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _state(processes: dict[str, bool], role: str) -> Text:
    if role not in processes:
        return Text("-")
    return Text("running", style="green") if processes[role] else Text("stopped", style="bold red")


def _throttle(gpu: GpuTelemetry | None) -> Text:
    if gpu is None or gpu.clock_events is None:
        return Text("-")
    if gpu.throttles:
        return Text(", ".join(gpu.throttles), style="bold red")
    return Text("none", style="green")


def _telemetry_cells(gpu: GpuTelemetry | None) -> tuple[Text, str, str, Text]:
    """temperature (red from HOT_C), power, SM clock, throttle reasons; `-` for what the GPU does not report."""
    temp = None if gpu is None else gpu.temperature_c
    return (Text(_num(temp, "{:.0f} C"), style="bold red" if temp is not None and temp >= HOT_C else ""),
            _num(None if gpu is None else gpu.power_w, "{:.1f} W"),
            _num(None if gpu is None else gpu.sm_clock_mhz, "{:.0f} MHz"), _throttle(gpu))


def nodes_table(sample: TopSample) -> Table:
    table = Table("node", "GPU util", "memory used / total", "temp", "power", "SM clock", "throttle", "Ray", "vLLM",
                  title="nodes", title_justify="left")
    for n in sample.nodes:
        if not n.answered:
            table.add_row(n.name, Text(f"not answering: {n.error}", style="bold red"), "", "", "", "", "", "", "")
            continue
        util = Text(f"nvidia-smi: {n.gpu_error}", style="yellow") if n.gpu_error else Text(_num(n.gpu_util_pct, "{:.0f} %"))
        memory = f"{_bytes(n.memory_used_bytes)} / {_bytes(n.memory_total_bytes)}"
        if n.memory_source is MemorySource.UNIFIED:
            memory += " (unified)"
        ray = _state(n.processes, "main") if sample.launcher == "ray" else Text("-")
        vllm = _state(n.processes, "vllm" if sample.launcher == "ray" else "main")
        table.add_row(n.name, util, memory, *_telemetry_cells(n.gpu), ray, vllm)
    return table


FIGURE_COLUMNS = ("running", "waiting", "KV cache", "prefix hits", "prompt tok/s", "gen tok/s", "TTFT p50 / p90",
                  "ITL p50 / p90", "preemptions")


def _window(f: EndpointFigures) -> str:
    window = f"last {f.interval_s:g} s" if f.interval_s else "since start"
    if f.interval_s and f.since_start:
        window += "; nothing new for some figures: those since start"
    return window


def _figure_cells(f: EndpointFigures) -> list[str]:
    return [_num(f.running, "{:.0f}"), _num(f.waiting, "{:.0f}"), _num(f.kv_cache_usage, "{:.1%}"),
            _num(f.prefix_cache_hit_rate, "{:.0%}"), _num(f.prompt_tokens_per_s), _num(f.generation_tokens_per_s),
            f"{_ms(f.ttft_p50_s)} / {_ms(f.ttft_p90_s)}", f"{_ms(f.itl_p50_s)} / {_ms(f.itl_p90_s)}",
            _num(f.preemptions, "{:.0f}")]


def _said(view: EndpointView, figures: EndpointFigures) -> str:
    return view.prometheus.said() if view.prometheus else _window(figures)


def endpoint_table(view: EndpointView) -> Table | Text:
    if view.figures is None:
        return Text(f"{view.url}: {view.error}", style="bold red")
    table = Table(*FIGURE_COLUMNS, title=f"endpoint {view.url} ({_said(view, view.figures)})", title_justify="left")
    table.add_row(*_figure_cells(view.figures))
    return table


def replicas_table(total: EndpointView, replicas: Sequence[ReplicaView]) -> Table:
    """One row per replica, as its own /metrics says, and the total: the sums (KV cache, hits and latency
    quantiles are each replica's own, so the total shows none)."""
    window = _said(total, total.figures) if total.figures is not None else "no replica answered"
    why = [f"{r.target.label}: {r.error}" for r in replicas if r.figures is None]  # under the table: no wide cell
    table = Table("replica", *FIGURE_COLUMNS, title=f"endpoint {total.url}: {len(replicas)} replicas behind the "
                  f"router ({window})", title_justify="left", caption="\n".join(why) or None,
                  caption_justify="left", caption_style="bold red")
    for r in replicas:
        if r.figures is None:
            table.add_row(r.target.label, Text("not answering", style="bold red"), *[""] * (len(FIGURE_COLUMNS) - 1))
        else:
            table.add_row(r.target.label, *_figure_cells(r.figures))
    answered = f"total ({len(total.summed_from or ())} of {len(replicas)})"
    if total.figures is None:
        table.add_row(answered, *["-"] * len(FIGURE_COLUMNS), style="bold")
    else:
        table.add_row(answered, *_figure_cells(total.figures), style="bold")
    return table


def total_summary(total: EndpointView, replicas: Sequence[ReplicaView]) -> str:
    """The replicas' sum on one line (what adds up: requests, token rates, preemptions)."""
    f = total.figures
    head = (f"total {total.prometheus.said()}" if total.prometheus
            else f"total of {len(total.summed_from or ())}/{len(replicas)} replicas")
    if f is None:
        return f"{head}: {total.error}"
    return (f"{head}: running {_num(f.running, '{:.0f}')}, waiting {_num(f.waiting, '{:.0f}')}, "
            f"prompt {_num(f.prompt_tokens_per_s)} tok/s, generation {_num(f.generation_tokens_per_s)} tok/s, "
            f"preemptions {_num(f.preemptions, '{:.0f}')}")


def render(sample: TopSample, every: float) -> Group:
    parts: list[Any] = [Text(f"sparkcluster top, every {every:g} s, {time.strftime('%H:%M:%S', time.localtime(sample.at))}"
                             "  (Ctrl-C quits)", style="bold")]
    if sample.note:
        parts.append(Text(sample.note, style="yellow"))
    if sample.endpoint is not None and sample.replicas:
        parts.append(replicas_table(sample.endpoint, sample.replicas))
    elif sample.endpoint is not None:
        parts.append(endpoint_table(sample.endpoint))
    if sample.nodes:
        parts.append(nodes_table(sample))
    return Group(*parts)


def line(sample: TopSample) -> str:
    """One plain line per interval (output into a pipe)."""
    parts = [time.strftime("%H:%M:%S", time.localtime(sample.at))]
    if sample.endpoint is not None and sample.replicas:
        parts.append(total_summary(sample.endpoint, sample.replicas))
        parts += [f"{r.target.label}: {r.figures.summary()}" if r.figures else
                  f"{r.target.label}: not answering ({r.error})" for r in sample.replicas]
    elif sample.endpoint is not None:
        e = sample.endpoint
        said = f"{e.prometheus.said()}: " if e.prometheus else ""
        parts.append(f"{said}{e.figures.summary()}" if e.figures else f"endpoint: {e.error}")
    for n in sample.nodes:
        if not n.answered:
            parts.append(f"{n.name}: not answering ({n.error})")
        else:
            gpu = f", {n.gpu.summary()}" if n.gpu is not None else ""
            parts.append(f"{n.name}: GPU {_num(n.gpu_util_pct, '{:.0f} %')}{gpu}, memory {_bytes(n.memory_used_bytes)}")
    return " | ".join(parts)


# ---- the loop -----------------------------------------------------------------------------------------------
def watch(source: Source, every: float, once: bool, as_json: bool, view: Console) -> int:
    if once:
        if source.url is not None:
            source.read()  # the first scrape: rates and quantiles need the interval to the second one
            time.sleep(every)
        sample = source.read()
        if as_json:
            print_json(sample.to_json())
        else:
            view.print(render(sample, every))
        return EXIT_OK if sample.complete else EXIT_FAILED
    try:
        if not view.is_terminal or as_json:
            while True:
                started = time.monotonic()
                sample = source.read()
                if as_json:
                    print_json(sample.to_json())
                else:
                    print(line(sample), flush=True)
                time.sleep(max(0.0, every - (time.monotonic() - started)))
        with Live(console=view, screen=True, auto_refresh=False) as live:
            while True:
                started = time.monotonic()
                live.update(render(source.read(), every), refresh=True)
                time.sleep(max(0.0, every - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C is how a live view ends
