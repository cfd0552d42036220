"""The endpoint's figures as the cluster's Prometheus saw them over the last minutes (`sparkcluster monitor up`),
for `status`, `top` and `bench`: a range instead of one scrape, so a quiet second does not read as an idle server.

Where Prometheus runs is what `monitor up` left at its place (the head, or this machine with --here): a live pid
file and the args it was started with (its --web.listen-address). One shell line at that place checks both and,
only when it runs, asks its HTTP API every query at once, printing one JSON document: one SSH round trip on the
head, nothing opened to the LAN (Prometheus listens on loopback). Anything short of an answer with vLLM's series
in it (not started, stopped, not answering, no engine scraped yet) is None: callers then read /metrics as before.

The queries read the `vllm` job only (each engine or replica, Ray's names renamed at scrape), summed over
replicas: the endpoint as a whole. Quantiles come from the replicas' histogram buckets summed per bucket (a
quantile of the whole, which summing two scrapes' quantiles could not give).
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.command import Command
from ..engine.session import Session
from .scrape import EndpointFigures

WINDOW_S = 300  # "last 5 min": 20 of monitor's 15 s scrapes
PROMETHEUS_PREFIX = ".local/share/sparkcluster/monitor/prometheus/prometheus"  # monitor/deploy.py's, from home
ASK_TIMEOUT_S = 10.0
# A place runs a shell line from its login home: (exit code, stdout). The head over SSH, or this machine.
Runner = Callable[[str], tuple[int, str]]

_ASK = r"""
import json, re, sys, urllib.parse, urllib.request
m = re.search(r"--web\.listen-address=['\"]?([^'\" ]+)", sys.argv[1])
if not m:
    sys.exit(4)
listen = m.group(1).replace("0.0.0.0:", "127.0.0.1:")
out = {"listen": m.group(1), "values": {}}
for name, query in json.loads(sys.argv[2]).items():
    url = "http://%s/api/v1/query?%s" % (listen, urllib.parse.urlencode({"query": query}))
    try:
        result = json.loads(urllib.request.urlopen(url, timeout=5).read().decode())["data"]["result"]
        out["values"][name] = float(result[0]["value"][1]) if result else None
    except Exception as e:
        out["values"][name] = None
        out.setdefault("errors", {})[name] = type(e).__name__
print(json.dumps(out))
"""


def _vllm(name: str) -> str:
    return f'{name}{{job="vllm"}}'


def _quantile(q: float, names: tuple[str, ...], window: str) -> str:
    # `or`: the newer histogram where an engine exports it, else the older (vLLM exports ITL under either name)
    per_le = " or ".join(f"sum by (le) (rate({_vllm(n + '_bucket')}[{window}]))" for n in names)
    return f"histogram_quantile({q}, {per_le})"


def queries(window_s: int = WINDOW_S) -> dict[str, str]:
    """Each figure's PromQL over the window (instant queries of range vectors: one value per figure)."""
    w = f"{window_s}s"
    hits, asked = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
    return {
        "generation_tokens_per_s": f"sum(rate({_vllm('vllm:generation_tokens_total')}[{w}]))",
        "prompt_tokens_per_s": f"sum(rate({_vllm('vllm:prompt_tokens_total')}[{w}]))",
        # requests: the window's mean of the endpoint's total (a range: not one instant's count)
        "running": f"sum(avg_over_time({_vllm('vllm:num_requests_running')}[{w}]))",
        "waiting": f"sum(avg_over_time({_vllm('vllm:num_requests_waiting')}[{w}]))",
        "kv_cache_usage": f"avg(avg_over_time({_vllm('vllm:kv_cache_usage_perc')}[{w}]))",
        "prefix_cache_hit_rate": f"sum(increase({_vllm(hits)}[{w}])) / sum(increase({_vllm(asked)}[{w}]))",
        "ttft_p50_s": _quantile(0.5, ("vllm:time_to_first_token_seconds",), w),
        "ttft_p90_s": _quantile(0.9, ("vllm:time_to_first_token_seconds",), w),
        "itl_p50_s": _quantile(0.5, ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), w),
        "itl_p90_s": _quantile(0.9, ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), w),
        "preemptions": f"sum({_vllm('vllm:num_preemptions_total')})",
    }


def ask_script(window_s: int = WINDOW_S, prefix: str = PROMETHEUS_PREFIX) -> str:
    """The shell line a place runs: exit 3 where Prometheus does not run there, else the answers as JSON."""
    p = shlex.quote(prefix)
    return (f"kill -0 \"$(cat {p}.pid 2>/dev/null)\" 2>/dev/null || exit 3; "
            f"python3 -c {shlex.quote(_ASK)} \"$(cat {p}.args 2>/dev/null)\" {shlex.quote(json.dumps(queries(window_s)))}")


@dataclass(frozen=True)
class PrometheusRange:
    """The endpoint's figures over the window, and where they came from."""

    place: str  # the node's name, or "this machine"
    listen: str
    window_s: int
    figures: EndpointFigures

    def said(self) -> str:
        """How the output names its source: `from Prometheus on spark-1, last 5 min`."""
        window = f"{self.window_s / 60:g} min" if self.window_s >= 60 else f"{self.window_s} s"
        return f"from Prometheus on {self.place}, last {window}"

    def source(self) -> dict[str, Any]:
        """--json's `source` field (absent where the figures are /metrics' own, as before `monitor`)."""
        return {"from": "prometheus", "place": self.place, "listen": self.listen, "window_s": self.window_s}


def read_answer(place: str, stdout: str, window_s: int = WINDOW_S) -> PrometheusRange | None:
    """The place's JSON, as figures; None where it is no answer or Prometheus holds no vLLM series (no engine
    scraped: nothing to say about the endpoint)."""
    try:
        doc = json.loads(stdout)
        values: Mapping[str, Any] = doc["values"]
        listen = str(doc["listen"])
    except (json.JSONDecodeError, KeyError, TypeError):
        return None
    def value(name: str) -> float | None:  # NaN (a quantile of no request, 0/0) and absent are both unknown
        v = values.get(name)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

    generated = value("generation_tokens_per_s")
    if generated is None:
        return None
    return PrometheusRange(place, listen, window_s, EndpointFigures(
        running=_mean(value("running")), waiting=_mean(value("waiting")), kv_cache_usage=value("kv_cache_usage"),
        prefix_cache_hit_rate=value("prefix_cache_hit_rate"), prompt_tokens_per_s=value("prompt_tokens_per_s"),
        generation_tokens_per_s=generated, ttft_p50_s=value("ttft_p50_s"), ttft_p90_s=value("ttft_p90_s"),
        itl_p50_s=value("itl_p50_s"), itl_p90_s=value("itl_p90_s"), preemptions=value("preemptions"),
        interval_s=float(window_s)))


def _mean(v: float | None) -> float | None:
    """A window's mean count of requests, to a hundredth (the summary prints it as it is: 0.33, not 0.333333)."""
    return None if v is None else round(v, 2)


def ask(place: str, run: Runner, window_s: int = WINDOW_S) -> PrometheusRange | None:
    """Prometheus' figures where it runs at `place`; None where it does not, or does not answer. Never raises."""
    try:
        code, stdout = run(ask_script(window_s))
    except Exception:  # noqa: BLE001 - an unreachable head, a dead transport: the figures come from /metrics
        return None
    return read_answer(place, stdout, window_s) if code == 0 else None


def run_here(script: str) -> tuple[int, str]:
    """This machine's runner (Prometheus started with `monitor up --here`)."""
    try:
        done = subprocess.run(["sh", "-c", script], cwd=Path.home(), capture_output=True, text=True,
                              timeout=ASK_TIMEOUT_S * 3, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return -1, ""
    return done.returncode, done.stdout


def find(head: str | None, run_on_head: Runner | None, window_s: int = WINDOW_S) -> PrometheusRange | None:
    """The head's Prometheus (`monitor up`), else this machine's (`monitor up --here`), else None."""
    if head is not None and run_on_head is not None:
        got = ask(head, run_on_head, window_s)
        if got is not None:
            return got
    return ask("this machine", run_here, window_s)


def of_session(session: Session, window_s: int = WINDOW_S) -> PrometheusRange | None:
    """`find` for a connected cluster: the head asked over the session's own connection (no second SSH login)."""
    head = session.head

    def on_head(script: str) -> tuple[int, str]:
        result = session.run(head, Command(script, timeout=ASK_TIMEOUT_S * 3))
        return result.exit_code, result.stdout
    return find(head.name, on_head, window_s)
