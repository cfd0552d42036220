"""The key guard: a program serve runs on a node, in front of a server it starts as its child (a vLLM that answers
HTTP, or vllm-router), which listens on the node's loopback only. Its source is the program: serve hands it to the
node's Python as `python3 -c SOURCE` (serving/guard.py), so it imports nothing but the standard library: it runs
in any vLLM environment or image, and in the router's container, with nothing to install.

Why a guard (issue 46, F1/F2): vLLM checks its API key only under /v1, /v2, /inference and /cohere, so
`POST /invocations` and /tokenize run the model without it; vllm-router checks no key at all (its --api-key is the
key it *sends* to workers, even on a client's keyless /invocations), and serves /add_worker, /remove_worker,
/list_workers and /flush_cache on the endpoint's port to anyone. Neither has an option that closes a path. The guard
forwards only the OpenAI API (/v1/...) and what `status` and `top` read (/health, /metrics, /version), the API only
with the key (VLLM_API_KEY from its environment, where serve put it off the process list); every other path is
answered 404 here and never reaches the server. The router's admin API is then reached on the head's loopback only.

One request per connection (the answer says `Connection: close`): a second request on a kept connection would
otherwise pass unchecked. A request's body is read only once its key is checked, and only with a Content-Length;
anything a strict parser might read two ways (a line break inside a header, two Content-Lengths, chunked bodies)
is refused. The server's answer is relayed byte for byte as it comes, so streamed completions stream.

It exits when its child does (with its status), and on SIGTERM or SIGINT stops the child and waits for it, so the
runtimes stop it as they stopped the server alone.

Usage: python3 -c SOURCE --listen HOST:PORT --upstream PORT -- CHILD ARGV..."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
import signal
import sys

KEY_ENV = "VLLM_API_KEY"
OPEN = ("/health", "/metrics", "/version")  # read without the key by status and top; they run no model
API = "/v1/"  # the OpenAI API, the only one clients of this tool use; with the key
SAFE_PATH = re.compile(r"(/[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*)+/?")  # no dot segments, no empty ones, nothing encoded
METHOD = re.compile(r"[A-Z]{3,10}")
DIGITS = re.compile(r"[0-9]{1,12}")  # not str.isdigit(), which takes "²" that int() then refuses
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header's name, as HTTP defines it
HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
                 "trailer", "upgrade", "expect", "content-length"})
SINGLE = ("content-length", "authorization", "host")  # twice: refused, as two readers may take different ones
REASONS = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 408: "Request Timeout", 411: "Length Required",
           413: "Payload Too Large", 502: "Bad Gateway"}
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
# Connections at once: each may hold a head of MAX_HEAD (64 MiB in all), and a keyed body of MAX_BODY while it is
# forwarded; far more than the concurrency a Spark serves.
MAX_CONNECTIONS = 1024
HEAD_S = 30  # a client's request line and headers must come within this
BODY_S = 300
STOP_S = 30  # how long a stopped guard waits for its child before killing it


def decide(method: str, path: str, authorization: str | None, key: str | None) -> int:
    """0: forward; else the status to answer. A key given, every path but OPEN needs it (any method)."""
    if not SAFE_PATH.fullmatch(path) or not (path in OPEN or path.startswith(API)):
        return 404
    if key is None or path in OPEN or method == "OPTIONS":
        return 0
    scheme, _, token = (authorization or "").partition(" ")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
    return 0 if ok else 401


def refusal(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def parse_head(head: bytes) -> tuple[str, str, list[tuple[str, str]]] | int:
    """(method, target, headers with lower-case names) of a request's head, or the status that refuses it."""
    text = head.decode("latin-1")
    lines = text[:-4].split("\r\n")
    if any(c in text[:-4].replace("\r\n", "") for c in "\r\n\0"):
        return 400
    words = lines[0].split(" ")
    if len(words) != 3 or not METHOD.fullmatch(words[0]) or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
        return 400
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not TOKEN.fullmatch(name):
            return 400
        headers.append((name.lower(), value.strip()))
    names = [n for n, _ in headers]
    if "transfer-encoding" in names:
        return 411
    if any(names.count(n) > 1 for n in SINGLE):
        return 400
    return words[0], words[1], headers


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: int, key: str | None) -> None:
    """One client connection: one request, checked, forwarded to the loopback's `upstream` port, its answer relayed."""
    try:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_S)
        except asyncio.LimitOverrunError:
            writer.write(refusal(400, "the request's head is too long"))
            return
        except (asyncio.IncompleteReadError, asyncio.TimeoutError):
            return
        parsed = parse_head(head)
        if isinstance(parsed, int):
            writer.write(refusal(parsed, "a request this guard does not forward"))
            return
        method, target, headers = parsed
        given = dict(headers)
        length = given.get("content-length", "0")
        path = target.split("?", 1)[0]
        if not DIGITS.fullmatch(length) or int(length) > (0 if path in OPEN else MAX_BODY):
            # The open paths take no body: anyone may reach them, and a body is read into memory before forwarding.
            writer.write(refusal(413 if DIGITS.fullmatch(length) else 400, "the request's Content-Length"))
            return
        status = decide(method, path, given.get("authorization"), key)
        if status:
            writer.write(refusal(status, f"{path[:200]} is not served here" if status == 404
                                 else "Unauthorized"))
            return
        if given.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            body = await asyncio.wait_for(reader.readexactly(int(length)), BODY_S)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError):
            writer.write(refusal(408, "the request's body did not come whole"))
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError as e:
            writer.write(refusal(502, f"the server behind the guard did not answer: {e}"))
            return
        try:
            kept = "".join(f"{n}: {v}\r\n" for n, v in headers if n not in HOP)
            up_writer.write(f"{method} {target} HTTP/1.1\r\n{kept}Content-Length: {len(body)}\r\n"
                            "Connection: close\r\n\r\n".encode("latin-1") + body)
            await up_writer.drain()
            while chunk := await up_reader.read(65536):  # as it comes: streamed completions stream
                writer.write(chunk)
                await writer.drain()
        finally:
            up_writer.close()
    except (ConnectionError, OSError):
        pass  # the client or the server went away: nothing to answer
    finally:
        try:
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        writer.close()


async def run(argv: list[str]) -> int:
    split = argv.index("--")
    options = dict(zip(argv[:split:2], argv[1:split:2]))
    host, _, port = options["--listen"].rpartition(":")
    upstream, key = int(options["--upstream"]), os.environ.get(KEY_ENV) or None
    # A port already taken fails here, before the child starts.
    open_connections = asyncio.Semaphore(MAX_CONNECTIONS)

    async def bounded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if open_connections.locked():  # full: closed at once, so slow clients cannot hold its memory past the bound
            writer.close()
            return
        async with open_connections:
            await handle(reader, writer, upstream, key)

    server = await asyncio.start_server(bounded, host, int(port), limit=MAX_HEAD)
    print(f"keyguard: {options['--listen']} -> 127.0.0.1:{upstream}, "
          f"{'the API with the key' if key else 'no key given'}; other paths refused", file=sys.stderr, flush=True)
    child = await asyncio.create_subprocess_exec(*argv[split + 1:])
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    waits = [asyncio.ensure_future(child.wait()), asyncio.ensure_future(stop.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    server.close()
    if child.returncode is None:
        child.terminate()
        try:
            await asyncio.wait_for(child.wait(), STOP_S)
        except asyncio.TimeoutError:
            child.kill()
            await child.wait()
    code = child.returncode or 0
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(asyncio.run(run(sys.argv[1:])))
