"""The ceiling of `sparkcluster bench`'s own client: against a server that answers instantly (tests/openai_stub.py
in its own process, every token at once), how many concurrent streams it holds and how many output tokens per
second one core of the client parses, so the client is never what a measurement measures.
Goal: 256 concurrent streams and at least 20,000 output tokens/s per client CPU second.

    .venv/bin/python benchmarks/bench_client.py [--streams 1,16,64,256] [--tokens 256] [--per-stream 2] [--itl 0]

Figures from this run only: tokens per client CPU second (time.process_time of this process; the stub's CPU is
its own), the streams the server saw in flight at once, ratios against the 1-stream baseline and the goal, and,
where httpx is installed, the same loop on httpx (the alternative that was measured and not chosen).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkcluster.bench import load  # noqa: E402
from tests.openai_stub import running_stub  # noqa: E402

GOAL_STREAMS, GOAL_TPS = 256, 20_000


def stub_gauge(url: str, name: str) -> float:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10) as response:
        line = next(li for li in response.read().decode().splitlines() if li.startswith(name))
    return float(line.split()[-1])


async def with_aiohttp(url: str, streams: int, tokens: int, per_stream: int) -> int:
    async with load.session(streams, 60) as client:
        endpoint = load.Endpoint(url, "stub-model")
        run = await load.run_concurrency(client, endpoint, ["a b c d"] * (streams * per_stream), streams, tokens)
    assert all(r.ok for r in run.requests), next(r.error for r in run.requests if not r.ok)
    return sum(r.completion_tokens for r in run.requests)


async def with_httpx(url: str, streams: int, tokens: int, per_stream: int) -> int:
    """The same streams on httpx, parsed the same way (for the record of why aiohttp)."""
    import httpx

    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        async def one() -> int:
            body = load.request_body("stub-model", "a b c d", tokens)
            usage: dict = {}
            async with client.stream("POST", f"{url}/completions", json=body) as response:
                pending = b""
                async for data in response.aiter_raw():
                    *lines, pending = (pending + data).split(b"\n")
                    for line in lines:
                        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                            usage = json.loads(line[5:]).get("usage") or usage
            return int(usage["completion_tokens"])

        async def stream() -> int:
            return sum([await one() for _ in range(per_stream)])

        return sum(await asyncio.gather(*(stream() for _ in range(streams))))


def measure(client, url: str, streams: int, tokens: int, per_stream: int) -> tuple[int, float, float, float]:
    """(tokens, wall s, client CPU s, peak streams in flight at the server)."""
    before_peak = stub_gauge(url, "stub:peak_running")
    cpu, wall = time.process_time(), time.perf_counter()
    got = asyncio.run(client(url, streams, tokens, per_stream))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return got, wall, cpu, max(stub_gauge(url, "stub:peak_running"), before_peak)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,16,64,256")
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    parser.add_argument("--per-stream", type=int, default=2, help="requests per stream")
    parser.add_argument("--itl", type=float, default=0.0,
                        help="the stub's seconds between tokens (default 0: all at once; 0.01 paces every token "
                             "into its own network read, as a real server's stream arrives)")
    args = parser.parse_args()
    levels = [int(s) for s in args.streams.split(",")]
    clients = [("aiohttp", with_aiohttp)]
    try:
        import httpx  # noqa: F401

        clients.append(("httpx", with_httpx))
    except ImportError:
        pass
    results: dict[tuple[str, int], float] = {}
    print(f"{'client':8} {'streams':>7} {'in flight':>9} {'tokens':>8} {'wall s':>7} {'CPU s':>6} "
          f"{'tok/s':>8} {'tok/CPU-s':>10} {'vs 1 stream':>11} {'vs goal':>8}")
    for name, client in clients:
        for streams in levels:
            # A fresh stub per level: its peak-in-flight gauge then belongs to this level alone.
            with running_stub(ttft=0, itl=args.itl) as url:
                tokens, wall, cpu, in_flight = measure(client, url, streams, args.tokens, args.per_stream)
            per_cpu = tokens / cpu if cpu > 0 else float("inf")
            results[(name, streams)] = per_cpu
            baseline = results.get((name, levels[0]), per_cpu)
            print(f"{name:8} {streams:7d} {in_flight:9.0f} {tokens:8d} {wall:7.2f} {cpu:6.2f} {tokens / wall:8.0f} "
                  f"{per_cpu:10.0f} {per_cpu / baseline:10.2f}x {per_cpu / GOAL_TPS:7.2f}x")
    top = max(levels)
    verdict = results[("aiohttp", top)] >= GOAL_TPS and top >= GOAL_STREAMS
    print(f"\naiohttp at {top} streams: {results[('aiohttp', top)]:,.0f} output tokens per client CPU second "
          f"({results[('aiohttp', top)] / GOAL_TPS:.2f}x the goal of {GOAL_TPS:,}): {'PASS' if verdict else 'FAIL'}")
    if ("httpx", top) in results:
        print(f"aiohttp / httpx at {top} streams: {results[('aiohttp', top)] / results[('httpx', top)]:.1f}x "
              "tokens per CPU second")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
