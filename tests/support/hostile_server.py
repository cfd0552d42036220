"""An OpenAI-compatible server that misbehaves, one route per misbehaviour, for the hardening tests: every
route is `http://127.0.0.1:PORT/<mode>/v1`, and `/<mode>/metrics`, `/<mode>/version` beside it. What is not the
mode's misbehaviour answers as a healthy server would, so each route tests one thing.

    python -m tests.support.hostile_server --port 0        # prints `port N` once it listens
    python -m tests.support.hostile_server --port 0 --every trickle    # every path misbehaves (`status` asks /health)

Loopback only. Every endless answer stops when the client goes away (a trickle also after TRICKLE_FOR_S).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal

from tests.support.openai_stub import read_request

# A healthy streamed token, and the closing usage event, as vLLM sends them.
TOKEN = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
USAGE = {"id": "x", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}}

# Streams: what each mode sends as its events (each a `data:` payload), after which it closes properly.
EVENT_MODES: dict[str, list[object]] = {
    "choices-int": [{"choices": 5}],
    "choices-str": [{"choices": "tok"}],
    "choices-non-objects": [{"choices": [1, "a", None]}],
    "choices-null": [{"choices": None, "usage": None}],
    "choices-text-int": [{"choices": [{"index": 0, "text": 7, "finish_reason": None}]}],
    "delta-str": [{"choices": [{"index": 0, "delta": "tok", "finish_reason": None}]}],
    "event-int": [5],
    "event-list": [[1, 2]],
    "event-not-json": ["{not json"],
    "usage-list": [TOKEN, {"choices": [], "usage": [1, 2]}],
    "usage-str": [TOKEN, {"choices": [], "usage": "lots"}],
    "usage-negative": [TOKEN, {"choices": [], "usage": {"prompt_tokens": -1, "completion_tokens": "4"}}],
    "error-int": [{"error": 5}],
}
MODELS_MODES: dict[str, object] = {
    "models-data-int": {"object": "list", "data": 5},
    "models-data-strings": {"object": "list", "data": ["m"]},
    "models-not-json": "<html>proxy error</html>",
    "models-list": [{"id": "m"}],
}
METRICS_MODES = {
    "metrics-nan": "NaN",
    "metrics-inf": "+Inf",
    "metrics-neg-inf": "-Inf",
    "metrics-garbage": "not-a-number",
}
SCRAPE_MODES = (*METRICS_MODES, "metrics-endless", "accept-never-answer")  # what `top` reads: /metrics only
# Any path: the headers, then a body a byte a second (for TRICKLE_FOR_S, then the connection closes: a client without
# a deadline of its own waits that long), or a body sent at full speed that never ends.
ANY_PATH_MODES = ("trickle", "endless-body")
TRICKLE_FOR_S = 120
ENDLESS_MODES = ("stream-endless-tokens", "stream-endless-comments", "stream-no-line-break", "models-huge",
                 "accept-never-answer")


def metrics(value: str = "1.0") -> str:
    return "\n".join([
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {value}',
        f'vllm:num_preemptions_total{{model_name="m"}} {value}',
        f'vllm:generation_tokens_total{{model_name="m"}} {value}',
        f'vllm:prompt_tokens_total{{model_name="m"}} {value}',
        f'vllm:prefix_cache_queries_total{{model_name="m"}} {value}',
        f'vllm:prefix_cache_hits_total{{model_name="m"}} {value}',
        "",
    ])


class Hostile:
    def __init__(self, every: str | None = None) -> None:
        self.every = every  # the mode of every path (no mode in the path): a server whose /health misbehaves

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                _, path, body = await read_request(reader)
                mode, _, rest = path.lstrip("/").partition("/")
                if self.every is not None:
                    mode, rest = self.every, path.lstrip("/")
                streamed = not body or json.loads(body).get("stream", False)
                await self.answer(mode, "/" + rest, writer, streamed)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def answer(self, mode: str, path: str, writer: asyncio.StreamWriter, streamed: bool) -> None:
        if mode == "accept-never-answer":
            await asyncio.sleep(3600)
        if mode == "trickle":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
            for _ in range(TRICKLE_FOR_S):
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(1)
            raise ConnectionError("trickled long enough")
        if mode == "endless-body":
            await self.endless(writer, b"x" * 65536)
        if path == "/v1/models":
            if mode == "models-huge":
                await self.endless(writer, b'{"object": "list", "data": [' + b'{"id": "m"}, ' * 4096)
            doc = MODELS_MODES.get(mode, {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})
            self.send(writer, doc if isinstance(doc, str) else json.dumps(doc), "application/json")
        elif path == "/version":
            self.send(writer, json.dumps({"version": "hostile"}), "application/json")
        elif path == "/metrics" and mode == "metrics-endless":
            await self.endless(writer, metrics().encode() * 64)
        elif path == "/metrics":
            self.send(writer, metrics(METRICS_MODES.get(mode, "1.0")), "text/plain")
        elif path in ("/v1/completions", "/v1/chat/completions") and streamed:
            await self.stream(mode, writer)
        elif path in ("/v1/completions", "/v1/chat/completions"):
            await self.whole(mode, path.endswith("chat/completions"), writer)
        else:
            self.send(writer, json.dumps({"error": f"no {path}"}), "application/json", status=404)

    @staticmethod
    def send(writer: asyncio.StreamWriter, text: str, kind: str, status: int = 200) -> None:
        data = text.encode()
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                     + data)

    @staticmethod
    def chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))

    async def endless(self, writer: asyncio.StreamWriter, piece: bytes, every_s: float = 0.0) -> None:
        """A chunked body that never ends: `piece` again and again until the client hangs up."""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            self.chunk(writer, piece)
            await writer.drain()  # raises ConnectionError once the client is gone
            await asyncio.sleep(every_s)

    async def whole(self, mode: str, chat: bool, writer: asyncio.StreamWriter) -> None:
        """A request without `stream`: the mode's first event is the whole answer (an endless mode streams
        its endless body all the same)."""
        if mode in ENDLESS_MODES:
            await self.stream(mode, writer)
        choice = {"index": 0, "finish_reason": "length", **({"message": {"role": "assistant", "content": "Paris"}}
                                                             if chat else {"text": "Paris"})}
        healthy = {"id": "x", "choices": [choice], "usage": USAGE["usage"]}
        doc = EVENT_MODES.get(mode, [healthy])[0]
        self.send(writer, doc if isinstance(doc, str) else json.dumps(doc), "application/json")

    async def stream(self, mode: str, writer: asyncio.StreamWriter) -> None:
        if mode == "stream-endless-tokens":
            await self.endless(writer, b"data: " + json.dumps(TOKEN).encode() + b"\n\n", 0.01)
        if mode == "stream-endless-comments":
            await self.endless(writer, b": keep-alive\n\n", 0.01)
        if mode == "stream-no-line-break":
            await self.endless(writer, b"data: " + b"x" * 65536)
        events = EVENT_MODES.get(mode, [TOKEN] * 4 + [USAGE])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for event in events:
            payload = event.encode() if isinstance(event, str) else json.dumps(event).encode()
            self.chunk(writer, b"data: " + payload + b"\n\n")
        self.chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")


async def serve(port: int, every: str | None = None) -> None:
    server = await asyncio.start_server(Hostile(every).handle, "127.0.0.1", port, backlog=256)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--every", choices=ANY_PATH_MODES, help="the misbehaviour of every path")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        asyncio.run(serve(args.port, args.every))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
