"""An OpenAI-compatible completions server with exactly known timing, for `sparkcluster bench`'s tests and
benchmarks/bench_client.py: the first token `ttft` seconds after the request, then one token every `itl`
seconds (scheduled on absolute times, so sleeps never drift), usage at the end when the client asks for it,
and vLLM's /metrics counters. No batching effects: every stream runs as if alone, so the truth is arithmetic.

    python -m tests.support.openai_stub --port 0 --ttft 0.2 --itl 0.02     # prints `port N` once it listens

It speaks just enough HTTP/1.1 itself (keep-alive, Content-Length bodies, chunked responses) to stay cheap
next to the client it measures. A prompt's token count is its number of whitespace-separated words (for chat,
over every message's content). With --prefill-tps the first token waits ttft + prompt tokens / prefill_tps, so a
prompt speed is exactly known too. Chat streams carry `token_ids` when asked (`return_token_ids`, as vLLM does);
a chat request that is not streamed answers --answer (llama-benchy's coherence question wants "Paris").
Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class StubOptions:
    ttft: float = 0.0
    itl: float = 0.0
    model: str = "stub-model"
    fail_after: int = -1  # answer HTTP 500 to every request after this many (-1: never)
    stall_after: int = -1  # accept but never answer requests after this many (-1: never)
    chunk_bytes: int = 0  # pad each token's text to about this size (0: short words)
    prefill_tps: float = 0.0  # prompt tokens per second before the first token (0: ttft alone)
    answer: str = "Paris."  # what a chat request that is not streamed answers
    api_key: str = ""  # as vLLM's --api-key: /v1 answers 401 without `Authorization: Bearer KEY` ("": no key)
    max_model_len: int = 0  # as vLLM's --max-model-len: listed by /v1/models, a prompt that fills it refused (0: none)
    refuse: str = ""  # answer every completion HTTP 400 with this message, in vLLM's error document ("": never)
    # As vLLM's --speculative-config num_speculative_tokens (0: none): one draft per two tokens generated, its first
    # token accepted and the rest rejected, so acceptance is 1/spec_tokens and the mean acceptance length 2.
    spec_tokens: int = 0


@dataclass
class StubState:
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    running: int = 0
    peak_running: int = 0
    drafts: int = 0  # speculative drafts verified (spec_tokens > 0)
    sockets: set = field(default_factory=set)


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
    """(method, path, body) of the next HTTP/1.1 request on a kept-alive connection."""
    method, path, _, body = await read_request_headers(reader)
    return method, path, body


async def read_request_headers(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    """(method, path, headers by lowercase name, body) of the next request."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
    return method, path, headers, await reader.readexactly(int(headers.get("content-length", "0")))


class Stub:
    def __init__(self, options: StubOptions) -> None:
        self.options, self.state = options, StubState()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                method, path, headers, body = await read_request_headers(reader)
                key = self.options.api_key
                if key and path.startswith("/v1") and headers.get("authorization") != f"Bearer {key}":
                    self.send_json(writer, 401, {"error": "Unauthorized"})  # vLLM's answer, word for word
                elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                    await self.complete(json.loads(body), writer, chat=path.endswith("chat/completions"))
                elif path == "/v1/models":
                    context = {"max_model_len": self.options.max_model_len} if self.options.max_model_len else {}
                    self.send_json(writer, 200, {"object": "list", "data": [{"id": self.options.model, **context}]})
                elif path == "/health":  # never guarded, as in vLLM
                    self.send(writer, 200, b"", "application/json")
                elif path == "/version":
                    self.send_json(writer, 200, {"version": "stub"})
                elif path == "/metrics":
                    self.send(writer, 200, self.metrics().encode(), "text/plain")
                else:
                    self.send_json(writer, 404, {"error": f"no {path}"})
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def send(self, writer: asyncio.StreamWriter, status: int, data: bytes, kind: str) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                     + data)

    def send_json(self, writer: asyncio.StreamWriter, status: int, doc: dict) -> None:
        self.send(writer, status, json.dumps(doc).encode(), "application/json")

    async def complete(self, request: dict, writer: asyncio.StreamWriter, chat: bool) -> None:
        o, s = self.options, self.state
        s.requests += 1
        if 0 <= o.stall_after < s.requests:
            await asyncio.sleep(3600)
        if 0 <= o.fail_after < s.requests:
            self.send_json(writer, 500, {"error": {"message": "stub: failing as asked"}})
            return
        prompt = " ".join(m["content"] for m in request["messages"]) if chat else request["prompt"]
        prompt_tokens = len(prompt.split())
        refusal = o.refuse or self.too_long(prompt_tokens)
        if refusal:  # vLLM's error document (tests/fixtures/vllm/cpu-0.32-400-*.json)
            self.send_json(writer, 400, {"error": {"message": refusal, "type": "BadRequestError", "param": None,
                                                   "code": 400}})
            return
        ttft = o.ttft + (prompt_tokens / o.prefill_tps if o.prefill_tps > 0 else 0.0)
        tokens = int(request.get("max_tokens") or 16)
        if o.max_model_len:  # vLLM cuts the output to what the context leaves
            tokens = min(tokens, o.max_model_len - prompt_tokens)
        s.prompt_tokens += prompt_tokens
        s.running += 1
        s.peak_running = max(s.peak_running, s.running)
        start = time.monotonic()
        try:
            if not request.get("stream"):
                await asyncio.sleep(ttft + max(tokens - 1, 0) * o.itl)
                if chat:  # answered in full, as a chat model does: not necessarily max_tokens
                    tokens = min(tokens, len(o.answer.split()))
                s.generation_tokens += tokens
                s.drafts += tokens // 2 if o.spec_tokens else 0
                choice = ({"message": {"role": "assistant", "content": o.answer}, "index": 0} if chat
                          else {"text": "tok " * tokens, "index": 0})
                self.send_json(writer, 200, {"choices": [choice], "usage": self.usage(prompt_tokens, tokens)})
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            word = "t" * max(o.chunk_bytes - 100, 3)
            for i in range(tokens):
                due = start + ttft + i * o.itl
                delay = due - time.monotonic()
                if delay > 0 or i % 16 == 0:  # an instant stub still lets other streams in now and then
                    await asyncio.sleep(max(delay, 0))
                last = i == tokens - 1
                choice = ({"index": 0, "delta": {"content": f" {word}{i}"}, "finish_reason": "length" if last else None}
                          if chat else {"index": 0, "text": f" {word}{i}", "finish_reason": "length" if last else None})
                if chat and request.get("return_token_ids"):
                    choice["token_ids"] = [1000 + i]
                self.event(writer, {"id": "x", "object": "text_completion", "model": o.model, "choices": [choice]})
                s.generation_tokens += 1
                s.drafts += 1 if o.spec_tokens and i % 2 else 0
                await writer.drain()
            if (request.get("stream_options") or {}).get("include_usage"):
                self.event(writer, {"id": "x", "model": o.model, "choices": [],
                                    "usage": self.usage(prompt_tokens, tokens)})
            data = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        finally:
            s.running -= 1

    def too_long(self, prompt_tokens: int) -> str:
        """vLLM's refusal of a prompt that leaves no room for output in --max-model-len, in its words (it counts no
        further than one token past the limit)."""
        limit = self.options.max_model_len
        if not limit or prompt_tokens < limit:
            return ""
        return (f"This model's maximum context length is {limit} tokens. However, your prompt contains at least "
                f"{limit + 1} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
                f"length of the input prompt. (parameter=input_tokens, value={limit + 1})")

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    @staticmethod
    def event(writer: asyncio.StreamWriter, doc: dict) -> None:
        data = b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))

    def metrics(self) -> str:
        s = self.state
        labels = f'{{model_name="{self.options.model}"}}'
        return "\n".join([
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{labels} {min(s.running / 256, 1.0)}",
            f"vllm:prompt_tokens_total{labels} {float(s.prompt_tokens)}",
            f"vllm:generation_tokens_total{labels} {float(s.generation_tokens)}",
            f"vllm:num_preemptions_total{labels} 0.0",
            f"vllm:prefix_cache_queries_total{labels} {float(s.prompt_tokens)}",
            f"vllm:prefix_cache_hits_total{labels} 0.0",
            *self.spec_metrics(),
            f"stub:requests_total {s.requests}",  # every completion request received, answered or not
            f"stub:peak_running {s.peak_running}",  # the most streams in flight at once
            "",
        ])


    def spec_metrics(self) -> list[str]:
        """vLLM 0.32's speculative decoding counters, names and labels as it writes them (vllm/v1/spec_decode/metrics.py,
        tests/fixtures/bench/vllm-0.32-cpu-ngram-metrics-*.txt); none without speculation, as vLLM."""
        k, drafts = self.options.spec_tokens, float(self.state.drafts)
        if not k:
            return []
        labels = f'engine="0",model_name="{self.options.model}"'
        return [f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
                f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafts * k}",
                f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {drafts}",
                *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}} {drafts if p == 0 else 0.0}'
                  for p in range(k))]


async def serve(options: StubOptions, port: int) -> None:
    stub = Stub(options)
    server = await asyncio.start_server(stub.handle, "127.0.0.1", port, backlog=1024)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


@contextmanager
def running_stub(**options: object) -> Iterator[str]:
    """A stub in its own process (its CPU never counts as the client's; its timing is not held up by the
    client's GIL); yields the base URL, e.g. http://127.0.0.1:40123/v1."""
    with running_server("tests.support.openai_stub", **options) as port:
        yield f"http://127.0.0.1:{port}/v1"


@contextmanager
def running_server(module: str, **options: object) -> Iterator[int]:
    """`python -m MODULE --port 0 --OPTION VALUE ...` in its own process; yields the port it printed."""
    argv = [sys.executable, "-m", module, "--port", "0"]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=root,
                               env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"{module} did not start: {line!r}")
        yield int(line.split()[1])
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    for name, default in vars(StubOptions()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = vars(parser.parse_args())
    port = args.pop("port")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # no orderly shutdown needed: nothing to keep
    try:
        asyncio.run(serve(StubOptions(**args), port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
