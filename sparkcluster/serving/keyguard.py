"""The key guard: a program serve runs on a node, in front of a server it starts as its child (vllm-router, or a
replica's vLLM), which listens on the node's loopback only. Its source is the program: serve hands it to the node's
Python as `python3 -c SOURCE` (serving/router.py:guarded), so it imports nothing of sparkcluster, only the standard
library and aiohttp (a dependency of vLLM, so in every vLLM environment and image).

Why a guard (issue 46, F1/F2): vLLM checks its API key only under /v1, /v2, /inference and /cohere, so
`POST /invocations` and /tokenize run the model without it; vllm-router checks no key at all (its --api-key is
the key it *sends* to workers, even on a client's keyless /invocations), and serves /add_worker, /remove_worker,
/list_workers and /flush_cache on the endpoint's port to anyone. Neither has an option that closes a path. The
guard forwards only the OpenAI API (/v1/...) and what `status` and `top` read (/health, /metrics, /version), the
API only with the key (VLLM_API_KEY from its environment, where serve put it off the process list); every other
path is answered 404 here and never reaches the server. The router's admin API stays on the head's loopback.

It exits when its child does (with its status), and on SIGTERM or SIGINT stops the child and waits for it, so the
runtimes stop it as they stopped the server alone.

Usage: python3 -c SOURCE --listen HOST:PORT --upstream PORT -- CHILD ARGV..."""

from __future__ import annotations

import asyncio
import hmac
import os
import re
import signal
import sys
from collections.abc import AsyncIterator

from aiohttp import ClientError, ClientSession, ClientTimeout, web

KEY_ENV = "VLLM_API_KEY"
OPEN = ("/health", "/metrics", "/version")  # read without the key by status and top; they run no model
API = "/v1/"  # the OpenAI API, the only one clients of this tool use; with the key
SAFE_PATH = re.compile(r"(/[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*)+/?")  # no dot segments, no empty ones, nothing encoded
HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                 "transfer-encoding", "upgrade", "host", "content-length"})
CLIENT = web.AppKey("client", ClientSession)
MAX_BODY = 64 * 1024 * 1024  # a request body, read only once its key is checked
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


def app(upstream: str, key: str | None) -> web.Application:
    """The guard's web application, forwarding what `decide` lets through to `upstream` (a base URL)."""
    async def forward(request: web.Request) -> web.StreamResponse:
        status = decide(request.method, request.raw_path.split("?", 1)[0], request.headers.get("Authorization"), key)
        if status == 404:
            return web.json_response({"error": f"{request.path[:200]} is not served here"}, status=404)
        if status:
            return web.json_response({"error": "Unauthorized"}, status=401)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read() if request.body_exists else None
        try:
            async with request.app[CLIENT].request(request.method, upstream + request.raw_path, headers=headers,
                                                     data=body, allow_redirects=False) as answer:
                response = web.StreamResponse(status=answer.status, headers={
                    k: v for k, v in answer.headers.items() if k.lower() not in HOP})
                await response.prepare(request)
                async for chunk in answer.content.iter_any():  # streamed completions pass as they come
                    await response.write(chunk)
                await response.write_eof()
                return response
        except ClientError as e:
            return web.json_response({"error": f"the server behind the guard did not answer: {e}"}, status=502)

    async def client(application: web.Application) -> AsyncIterator[None]:
        application[CLIENT] = ClientSession(timeout=ClientTimeout(total=None, sock_connect=10), auto_decompress=False)
        yield
        await application[CLIENT].close()

    application = web.Application(client_max_size=MAX_BODY)
    application.cleanup_ctx.append(client)
    application.router.add_route("*", "/{tail:.*}", forward)
    return application


async def run(argv: list[str]) -> int:
    split = argv.index("--")
    options = dict(zip(argv[:split:2], argv[1:split:2]))
    host, _, port = options["--listen"].rpartition(":")
    key = os.environ.get(KEY_ENV) or None
    runner = web.AppRunner(app(f"http://127.0.0.1:{options['--upstream']}", key), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, int(port)).start()  # a port already taken fails here, before the child starts
    print(f"keyguard: {options['--listen']} -> 127.0.0.1:{options['--upstream']}, "
          f"{'the API with the key' if key else 'no key given'}; other paths refused", file=sys.stderr, flush=True)
    child = await asyncio.create_subprocess_exec(*argv[split + 1:])
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    waits = [asyncio.ensure_future(child.wait()), asyncio.ensure_future(stop.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    if child.returncode is None:
        child.terminate()
        try:
            await asyncio.wait_for(child.wait(), STOP_S)
        except asyncio.TimeoutError:
            child.kill()
            await child.wait()
    await runner.cleanup()
    code = child.returncode or 0
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(asyncio.run(run(sys.argv[1:])))
