"""What the key guard in front of every vLLM and router costs (issue 46, F1/F2): the OpenAI stub
(tests/support/openai_stub.py, in its own process) as the server, then requests/s and median latency at each
concurrency, all on loopback in this run:
- direct, a new connection per request (the baseline: what the guard does, one request a connection);
- direct, kept-alive connections (what a client had before the guard);
- through the guard program itself (`python3 -c GUARD_SOURCE`, as serve starts it), with the key.
Also the guard's own CPU seconds per 1,000 requests (from /proc), which carries over to a Spark's Grace cores.

    .venv/bin/python benchmarks/keyguard_overhead.py [--concurrency 1,32] [--seconds 5] [--tokens 16] [--stream]

Each request is a completion of --tokens tokens (--stream: streamed, one event a token, each relayed by the guard as
it comes); the stub answers at once, so what is measured is the path's own cost. Figures are this run's only: ratios against the new-connection baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkcluster.serving.guard import GUARD_SOURCE  # noqa: E402
from tests.support.openai_stub import running_stub  # noqa: E402

KEY = "sk-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
    writer.write(request)
    status = await reader.readline()
    length, chunked = 0, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
        chunked = chunked or line.lower().startswith(b"transfer-encoding: chunked")
    if chunked:  # a streamed completion: every event relayed as it came, then the last chunk
        await reader.readuntil(b"\r\n0\r\n\r\n")
    else:
        await reader.readexactly(length)
    if b" 200 " not in status:
        raise RuntimeError(status.decode(errors="replace"))


async def client(port: int, request: bytes, kept: bool, until: float, latencies: list[float]) -> None:
    """Requests back to back until `until`: on one kept-alive connection, or each on a new one."""
    connection = await asyncio.open_connection("127.0.0.1", port) if kept else None
    while time.monotonic() < until:
        start = time.perf_counter()
        reader, writer = connection or await asyncio.open_connection("127.0.0.1", port)
        await exchange(reader, writer, request)
        if not kept:
            writer.close()
        latencies.append(time.perf_counter() - start)
    if connection:
        connection[1].close()


def measure(port: int, request: bytes, kept: bool, concurrency: int, seconds: float) -> tuple[float, float]:
    """(requests/s, median latency in ms)."""
    latencies: list[float] = []

    async def run() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(*(client(port, request, kept, until, latencies) for _ in range(concurrency)))

    asyncio.run(run())
    return len(latencies) / seconds, statistics.median(latencies) * 1000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--stream", action="store_true", help="streamed completions: one event a token relayed")
    args = parser.parse_args()
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": args.tokens, "stream": args.stream}).encode()
    with running_stub() as url:
        upstream = int(url.rsplit(":", 1)[1].split("/")[0])
        guard_port = free_port()
        guard = subprocess.Popen([sys.executable, "-c", GUARD_SOURCE, "--listen", f"127.0.0.1:{guard_port}",
                                  "--upstream", str(upstream), "--", "sleep", "3600"],
                                 env={**os.environ, "VLLM_API_KEY": KEY}, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{guard_port}/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.05)

            def request(port: int) -> bytes:
                return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
                        f"\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

            print(f"{'path':<34} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'vs base':>8}  guard CPU s/1k req"
                  f"{', /1M tokens' if args.stream else ''}")
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                base = 0.0
                for name, port, kept in (("direct, new connection (baseline)", upstream, False),
                                         ("direct, kept-alive", upstream, True),
                                         ("through the key guard", guard_port, False)):
                    before = cpu_seconds(guard.pid)
                    rate, p50 = measure(port, request(port), kept, concurrency, args.seconds)
                    spent = cpu_seconds(guard.pid) - before
                    base = base or rate
                    per_k = (f"{spent / (rate * args.seconds) * 1000:.2f}" + (
                        f", {spent / (rate * args.seconds * args.tokens) * 1e6:.1f}" if args.stream else "")
                             if port == guard_port else "")
                    print(f"{name:<34} {concurrency:>4} {rate:>8.0f} {p50:>8.2f} {rate / base:>7.2f}x  {per_k}")
        finally:
            guard.terminate()
            guard.wait(30)

if __name__ == "__main__":
    main()
