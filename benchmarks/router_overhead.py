"""What a router in front of replicas costs (issue 40): two OpenAI stubs (tests/support/openai_stub.py, each in its own
process) as the replicas, then requests/s and latency at each concurrency, straight to the stubs (the client
alternating between them: the baseline) and through each front end, all on loopback in this run:
- vllm-router (the vllm-router package, the Rust load balancer made for vLLM; what `serve --replicas` starts),
  round robin, as serve starts it;
- nginx (a plain reverse proxy), round robin with kept-alive upstream connections, where `nginx` is installed.

    .venv/bin/python benchmarks/router_overhead.py [--router .venv-vllm/bin/vllm-router] [--concurrency 1,32]
                                                   [--seconds 5] [--tokens 16] [--itl 0]

Each request is a non-streamed completion of --tokens tokens (--itl 0: the stubs answer at once, so what is
measured is the front end's own cost). Figures are this run's only: ratios against the direct baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.openai_stub import running_stub  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ROUTER_PORT, NGINX_PORT = 18300, 18301


async def one_connection(port: int, body: bytes, until: float, latencies: list[float]) -> None:
    """Requests back to back on one kept-alive connection until `until`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    try:
        while time.monotonic() < until:
            start = time.perf_counter()
            writer.write(head + body)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if b" 200 " not in status:
                raise RuntimeError(f"port {port}: {status!r}")
            latencies.append(time.perf_counter() - start)
    finally:
        writer.close()


async def load(ports: list[int], concurrency: int, seconds: float, body: bytes) -> tuple[float, list[float]]:
    """(requests/s, latencies) with `concurrency` connections spread over `ports`."""
    latencies: list[float] = []
    until = time.monotonic() + seconds
    start = time.monotonic()
    await asyncio.gather(*(one_connection(ports[i % len(ports)], body, until, latencies) for i in range(concurrency)))
    return len(latencies) / (time.monotonic() - start), latencies


def wait_for(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer")
        time.sleep(0.2)


@contextmanager
def vllm_router(binary: str, workers: list[str]) -> Iterator[int]:
    sys.path.insert(0, str(ROOT))
    from sparkcluster.serving.router import router_argv  # the argv serve starts, with this binary
    argv = [binary, *router_argv(workers, ROUTER_PORT)[1:]]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(f"http://127.0.0.1:{ROUTER_PORT}/health")
            yield ROUTER_PORT
        finally:
            process.terminate()
            process.wait(timeout=10)


@contextmanager
def nginx(workers: list[str]) -> Iterator[int]:
    with tempfile.TemporaryDirectory() as d:
        servers = "".join(f"server {w.removeprefix('http://')};" for w in workers)
        conf = Path(d) / "nginx.conf"
        conf.write_text(
            f"worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log; daemon off;\n"
            "events { worker_connections 1024; }\n"
            # nginx closes a client's and an upstream's connection after 1000 requests by default: not here
            f"http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d}; keepalive_requests 1000000;\n"
            f"  upstream replicas {{ {servers} keepalive 64; keepalive_requests 1000000; }}\n"
            f"  server {{ listen 127.0.0.1:{NGINX_PORT}; location / {{ proxy_pass http://replicas; "
            "proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; } } }\n")
        process = subprocess.Popen(["nginx", "-c", str(conf), "-p", d], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            wait_for(f"http://127.0.0.1:{NGINX_PORT}/health")
            yield NGINX_PORT
        finally:
            process.terminate()
            process.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", default=str(ROOT / ".venv-vllm" / "bin" / "vllm-router"))
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--itl", type=float, default=0.0)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    body = json.dumps({"model": "stub-model", "prompt": "The DGX Spark is", "max_tokens": args.tokens}).encode()
    rows: list[dict[str, object]] = []
    with ExitStack() as stack:
        stubs = [stack.enter_context(running_stub(itl=args.itl)) for _ in range(2)]
        workers = [s.removesuffix("/v1") for s in stubs]
        ports = [int(w.rsplit(":", 1)[1]) for w in workers]
        fronts: dict[str, list[int]] = {"direct": ports}
        if Path(args.router).exists():
            fronts["vllm-router"] = [stack.enter_context(vllm_router(args.router, workers))]
        if shutil.which("nginx"):
            fronts["nginx"] = [stack.enter_context(nginx(workers))]
        for c in levels:
            base_rps = base_p50 = 0.0
            for name, targets in fronts.items():
                asyncio.run(load(targets, c, 0.5, body))  # warm: connections and the front end's pools
                rps, lat = asyncio.run(load(targets, c, args.seconds, body))
                p50 = statistics.median(lat) * 1e3
                p99 = statistics.quantiles(lat, n=100)[98] * 1e3 if len(lat) >= 100 else max(lat) * 1e3
                if name == "direct":
                    base_rps, base_p50 = rps, p50
                rows.append({"front": name, "concurrency": c, "requests_per_s": round(rps, 1),
                             "p50_ms": round(p50, 3), "p99_ms": round(p99, 3),
                             "rps_vs_direct": round(rps / base_rps, 3), "added_p50_ms": round(p50 - base_p50, 3)})
    print(f"{'front':<12} {'c':>4} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'vs direct':>9} {'+p50 ms':>8}")
    for r in rows:
        print(f"{r['front']:<12} {r['concurrency']:>4} {r['requests_per_s']:>9} {r['p50_ms']:>8} {r['p99_ms']:>8} "
              f"{r['rps_vs_direct']:>9} {r['added_p50_ms']:>8}")
    print(json.dumps({"rows": rows, "seconds": args.seconds, "tokens": args.tokens, "itl": args.itl}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
