"""The ceiling of `sparkcluster bench`'s own client: against a server that answers instantly (tests/support/openai_stub.py
in its own process, every token at once), how many concurrent streams it holds and how many output tokens per
second one core of the client parses, so the client is never what a measurement measures.
Goal: 256 concurrent streams and at least 20,000 output tokens/s per client CPU second.

    .venv/bin/python benchmarks/bench_client.py [--streams 1,16,64,256] [--tokens 256] [--per-stream 2] [--itl 0]
    .venv/bin/python benchmarks/bench_client.py --llama-benchy-cell 100000x10 [--runs 3]

--llama-benchy-cell DEPTHxC: the client CPU one `--method llama-benchy` cell costs (building, tokenizing and
sending C prompts of DEPTH + 2048 tokens per burst, prefix caching on: a context load and an inference burst
per run, a warm-up run and --runs runs), against the same cell at depth 0 (the baseline), with a byte-level
BPE tokenizer.json trained here (the decode path of real models' tokenizers); then the same cell through
llama-benchy 0.4.0 itself (.venv-benchy) and through our CLI, each a whole process, CPU from rusage.

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

from sparkcluster.bench.methods.closed_loop import schedule as load  # noqa: E402
from tests.support.openai_stub import running_stub  # noqa: E402

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


def bpe_tokenizer(text: str, path: Path) -> None:
    """A byte-level BPE tokenizer.json trained on `text` (4,000 tokens), as GPT-style models ship."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(vocab_size=4000, show_progress=False))
    tokenizer.save(str(path))


def book(words: int = 150_000) -> str:
    """Text with a natural spread of word lengths (the sustained method's vocabulary, seeded)."""
    import random

    from sparkcluster.bench.prompts import WORDS

    rng = random.Random(7)
    return " ".join(rng.choices(WORDS, k=words))


async def one_cell(url: str, corpus, depth: int, concurrency: int, runs: int) -> tuple[float, float, int]:
    """(client CPU s, wall s, requests) of one cell, the session start excluded."""
    from sparkcluster.bench.methods.llama_benchy.chat import Client
    from sparkcluster.bench.methods.llama_benchy.schedule import BenchyOptions, Cell, http_session, run_cell, start

    opts = BenchyOptions(runs=runs, prefix_caching=True)
    client = Client(url, "stub-model", 600)
    async with http_session(concurrency) as http:
        session = await start(client, http, corpus, opts, True)
        cpu, wall = time.process_time(), time.perf_counter()
        entries, errors = await run_cell(client, http, corpus, opts, session, Cell(depth, 2048, 128, concurrency),
                                         lambda text: None)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert not errors, errors[0]
    return cpu, wall, (runs + 1) * concurrency * (2 if depth else 1)


def child_cpu(argv: list[str], env: dict[str, str]) -> float:
    """User + system CPU seconds of one whole process (and its children)."""
    import resource
    import subprocess

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def llama_benchy_cell(spec: str, runs: int) -> int:
    import hashlib
    import os
    import tempfile

    from sparkcluster.bench.corpus import BOOK_URL, Corpus, find_tokenizer

    depth, concurrency = (int(v) for v in spec.lower().split("x"))
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as home:
        text = book()
        cached = Path(home) / ".cache" / "llama-benchy" / f"{hashlib.md5(BOOK_URL.encode()).hexdigest()}.txt"
        cached.parent.mkdir(parents=True)
        cached.write_text(text)
        tokenizer_path = Path(home) / "tokenizer.json"
        bpe_tokenizer(text, tokenizer_path)
        cpu = time.process_time()
        corpus = Corpus(text, find_tokenizer(str(tokenizer_path), None))
        setup_cpu = time.process_time() - cpu
        print(f"tokenizer byte-level BPE, 4,000 tokens; corpus {len(corpus.tokens):,} tokens, tokenized once in "
              f"{setup_cpu:.2f} CPU s")
        print(f"{'cell':>14} {'requests':>8} {'wall s':>7} {'client CPU s':>12} {'CPU ms/request':>14} {'vs depth 0':>10}")
        base = None
        # The stub's prefill is 10M tok/s, so the wall time is mostly the client's and the transfer: a ceiling.
        with running_stub(ttft=0.01, itl=0.001, prefill_tps=10_000_000) as url:
            for d in (0, depth):
                cpu_s, wall, requests = asyncio.run(one_cell(url, corpus, d, concurrency, runs))
                base = base or cpu_s
                print(f"{f'd{d} c{concurrency}':>14} {requests:8d} {wall:7.2f} {cpu_s:12.2f} "
                      f"{cpu_s / requests * 1000:14.1f} {cpu_s / base:9.1f}x")
            grid = ["--pp", "2048", "--tg", "128", "--depth", str(depth), "--concurrency", str(concurrency),
                    "--runs", str(runs), "--enable-prefix-caching", "--tokenizer", str(tokenizer_path)]
            env = {**os.environ, "HOME": home}
            whole: dict[str, float] = {}
            benchy = root / ".venv-benchy" / "bin" / "llama-benchy"
            if benchy.exists():
                whole["llama-benchy 0.4.0"] = child_cpu(
                    [str(benchy), "--base-url", url, "--model", "stub-model", *grid, "--format", "json",
                     "--save-result", str(Path(home) / "theirs.json")], env)
            whole["sparkcluster bench"] = child_cpu(
                [sys.executable, "-m", "sparkcluster", "bench", "--url", url, "--method", "llama-benchy", *grid,
                 "--corpus", str(cached), "--json"], env)
        print("\nthe same cell, a whole process each (start-up, tokenizing the book, warm-up, the cell):")
        for name, seconds in whole.items():
            print(f"  {name:20} {seconds:6.2f} CPU s")
        if len(whole) == 2:
            print(f"  sparkcluster / llama-benchy: {whole['sparkcluster bench'] / whole['llama-benchy 0.4.0']:.2f}x")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-benchy-cell", metavar="DEPTHxC",
                        help="measure one --method llama-benchy cell's client CPU instead, e.g. 100000x10")
    parser.add_argument("--runs", type=int, default=3, help="with --llama-benchy-cell: runs per cell (default 3)")
    parser.add_argument("--streams", default="1,16,64,256")
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    parser.add_argument("--per-stream", type=int, default=2, help="requests per stream")
    parser.add_argument("--itl", type=float, default=0.0,
                        help="the stub's seconds between tokens (default 0: all at once; 0.01 paces every token "
                             "into its own network read, as a real server's stream arrives)")
    args = parser.parse_args()
    if args.llama_benchy_cell:
        return llama_benchy_cell(args.llama_benchy_cell, args.runs)
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
