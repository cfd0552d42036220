"""`sparkcluster top` against a real vLLM under a `bench` load: top's generation tok/s over the window bench
measures (all streams busy) against bench's figure, and one `top --once --json` sample in the middle of it with
running requests > 0. On a busy machine the rate moves from second to second: only the same window compares.

Uses the endpoint given with --url, or starts the CPU vLLM of .venv-vllm (scripts/setup-vllm.sh) on loopback
serving the tiny Llama (sparkcluster/sim/tinymodel.py) and stops it afterwards.

Run:  .venv/bin/python benchmarks/top_vs_bench.py [--url http://127.0.0.1:8000/v1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_ENV = ROOT / ".venv-vllm"
CLI = [sys.executable, "-m", "sparkcluster"]
BENCH = ["--concurrency", "4", "--prompt-tokens", "64", "--output-tokens", "384", "--runs", "1",
         "--requests-per-stream", "12", "--warmup", "1", "--json"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_vllm(hf_home: str) -> tuple[subprocess.Popen[bytes], str]:
    subprocess.run([str(VLLM_ENV / "bin" / "python"), str(ROOT / "sparkcluster" / "sim" / "tinymodel.py"), hf_home],
                   check=True, capture_output=True)
    port = free_port()
    env = {**os.environ, "HF_HOME": hf_home, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_NO_USAGE_STATS": "1"}
    log = open(Path(hf_home) / "vllm.log", "wb")
    server = subprocess.Popen([str(VLLM_ENV / "bin" / "vllm"), "serve", "local/tiny-llama", "--host", "127.0.0.1",
                               "--port", str(port), "--max-model-len", "1024", "--enforce-eager"],
                              stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return server, f"{url}/v1"
        except OSError:
            time.sleep(1)
    server.kill()
    raise SystemExit("vLLM did not answer /health within 300 s")


def running(url: str) -> float:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running"))


def documents(text: str) -> list[dict]:
    """The JSON documents `top --json` printed one after another."""
    decoder, docs, i = json.JSONDecoder(), [], 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text):
            doc, i = decoder.raw_decode(text, i)
            docs.append(doc)
    return docs


def measure(url: str, interval: float) -> None:
    """bench at C=4 while `top --json` samples every second (the window bench measures is the one where all 4
    streams are busy: top's samples with 4 running are the same window), and one `top --once --json` in the
    middle of it."""
    live = subprocess.Popen([*CLI, "top", "--url", url, "--json", "--interval", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    bench = subprocess.Popen([*CLI, "bench", "--url", url, *BENCH], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, cwd=ROOT)
    deadline = time.monotonic() + 120
    while running(url) < 4 and time.monotonic() < deadline:  # every stream busy: bench's measured window
        time.sleep(0.2)
    time.sleep(1.0)
    top = subprocess.run([*CLI, "top", "--url", url, "--once", "--json", "--interval", str(interval)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    out, _ = bench.communicate(timeout=900)
    live.send_signal(signal.SIGINT)
    samples = [d["endpoint"]["figures"] for d in documents(live.communicate(timeout=30)[0])
               if d["endpoint"] and d["endpoint"]["figures"]]
    busy = [f for f in samples if f["running"] == 4 and f["interval_s"] and f["generation_tokens_per_s"] is not None]
    window = sum(f["interval_s"] for f in busy)
    live_rate = sum(f["generation_tokens_per_s"] * f["interval_s"] for f in busy) / window
    figures = json.loads(top.stdout)["endpoint"]["figures"]
    row = json.loads(out)["rows"][0]
    print(f"top --once --json over {figures['interval_s']} s: running {figures['running']:g}, waiting "
          f"{figures['waiting']:g}, generation {figures['generation_tokens_per_s']:.1f} tok/s, "
          f"ITL p50 {figures['itl_p50_s'] * 1000:.1f} ms (exit {top.returncode})")
    print(f"top --json every 1 s, the {len(busy)} samples with all 4 streams running ({window:.1f} s): "
          f"generation {live_rate:.1f} tok/s")
    print(f"bench (c=4, 384 output tokens): generation {row['generation_tps']:.1f} tok/s, "
          f"ITL p50 {row['itl_s']['p50'] * 1000:.1f} ms, {row['requests']} requests, {row['errors']} errors")
    print(f"top/bench generation tok/s over the same window: {live_rate / row['generation_tps']:.3f}; "
          f"--once's sample/bench: {figures['generation_tokens_per_s'] / row['generation_tps']:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", help="a running vLLM (default: start the CPU vLLM of .venv-vllm)")
    parser.add_argument("--interval", type=float, default=3.0)
    args = parser.parse_args()
    if args.url:
        measure(args.url, args.interval)
        return 0
    with tempfile.TemporaryDirectory() as hf_home:
        server, url = start_vllm(hf_home)
        try:
            measure(url, args.interval)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
