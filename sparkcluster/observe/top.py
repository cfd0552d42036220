"""What `sparkcluster top` shows: the served cluster, live. Per node: GPU utilisation and memory, its temperature, power,
SM clock and throttle reasons, Ray and vLLM; for the
endpoint, vLLM's own figures from /metrics over the last interval. Full-screen on a terminal (rich), one line per
interval into a pipe, or one sample as a JSON document (`--once --json`).

It only reads: one /metrics GET and one short shell line per node per interval, nothing sent to the model. A node
or an endpoint that stops answering is shown as such and the view goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..engine.errors import EXIT_FAILED, EXIT_OK, UsageError
from ..engine.report import print_json
from ..node.gputelemetry import HOT_C, GpuTelemetry
from .nodeprobe import MemorySource, NodeSample, NodeSampler
from .scrape import EndpointFigures, Reading, fetch, figures, metrics_url

MIN_INTERVAL_S, MAX_INTERVAL_S = 0.2, 3600.0


@dataclass(frozen=True)
class EndpointView:
    url: str  # the /metrics address
    figures: EndpointFigures | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"metrics_url": self.url, "error": self.error,
                "figures": None if self.figures is None else self.figures.to_json()}


@dataclass(frozen=True)
class TopSample:
    at: float  # unix time
    endpoint: EndpointView | None
    nodes: list[NodeSample] = field(default_factory=list)
    launcher: str = "ray"  # how the nodes serve (ray, native): which processes a node shows
    note: str | None = None  # e.g. nothing served

    @property
    def complete(self) -> bool:
        """Everything asked for answered."""
        return all(n.answered for n in self.nodes) and (self.endpoint is None or self.endpoint.error is None)

    def to_json(self) -> dict[str, Any]:
        return {"time": round(self.at, 3), "launcher": self.launcher, "note": self.note,
                "endpoint": None if self.endpoint is None else self.endpoint.to_json(),
                "nodes": {n.name: n.to_json() for n in self.nodes}}


class Source:
    """What one sample reads: the endpoint's /metrics (where there is one) and the nodes (where connected)."""

    def __init__(self, url: str | None, sampler: NodeSampler | None, launcher: str, note: str | None) -> None:
        self.url, self.sampler, self.launcher, self.note = url, sampler, launcher, note
        self.previous: Reading | None = None

    def read(self) -> TopSample:
        endpoint = None
        if self.url is not None:
            reading = fetch(self.url)
            if reading.scrape is None:
                endpoint = EndpointView(self.url, error=reading.error)
            else:
                endpoint = EndpointView(self.url, figures(reading.scrape, self.previous, reading.at))
                self.previous = reading
        nodes = self.sampler.sample() if self.sampler else []
        return TopSample(time.time(), endpoint, nodes, self.launcher, self.note)


def url_of(text: str) -> str:
    """--url as given (`host:8000`, `http://host:8000/v1`) -> its /metrics address."""
    full = text.strip() if "://" in text else "http://" + text.strip()
    parts = urlsplit(full)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {text!r} is not an http(s) address", "e.g. --url http://192.168.1.50:8000/v1")
    return metrics_url(f"{parts.scheme}://{parts.netloc}{parts.path}")


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


def endpoint_table(view: EndpointView) -> Table | Text:
    if view.figures is None:
        return Text(f"{view.url}: {view.error}", style="bold red")
    f = view.figures
    window = f"last {f.interval_s:g} s" if f.interval_s else "since start"
    if f.interval_s and f.since_start:
        window += "; nothing new for some figures: those since start"
    table = Table("running", "waiting", "KV cache", "prefix hits", "prompt tok/s", "gen tok/s", "TTFT p50 / p90",
                  "ITL p50 / p90", "preemptions", title=f"endpoint {view.url} ({window})", title_justify="left")
    table.add_row(_num(f.running, "{:.0f}"), _num(f.waiting, "{:.0f}"), _num(f.kv_cache_usage, "{:.1%}"),
                  _num(f.prefix_cache_hit_rate, "{:.0%}"), _num(f.prompt_tokens_per_s), _num(f.generation_tokens_per_s),
                  f"{_ms(f.ttft_p50_s)} / {_ms(f.ttft_p90_s)}", f"{_ms(f.itl_p50_s)} / {_ms(f.itl_p90_s)}",
                  _num(f.preemptions, "{:.0f}"))
    return table


def render(sample: TopSample, every: float) -> Group:
    parts: list[Any] = [Text(f"sparkcluster top, every {every:g} s, {time.strftime('%H:%M:%S', time.localtime(sample.at))}"
                             "  (Ctrl-C quits)", style="bold")]
    if sample.note:
        parts.append(Text(sample.note, style="yellow"))
    if sample.endpoint is not None:
        parts.append(endpoint_table(sample.endpoint))
    if sample.nodes:
        parts.append(nodes_table(sample))
    return Group(*parts)


def line(sample: TopSample) -> str:
    """One plain line per interval (output into a pipe)."""
    parts = [time.strftime("%H:%M:%S", time.localtime(sample.at))]
    if sample.endpoint is not None:
        e = sample.endpoint
        parts.append(e.figures.summary() if e.figures else f"endpoint: {e.error}")
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
