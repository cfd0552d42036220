"""Issue 46, F1/F2: the key guard in front of the router and of each replica (serving/keyguard.py), the command lines
that put it there, and `status` comparing the router's workers with the serve record.

Before (c930bdd): the router and every replica listened on 0.0.0.0 themselves, so `POST /invocations` generated
without the key (vLLM checks it only under /v1) and vllm-router's /add_worker took a stranger's worker from anyone;
`status` never looked at the router's workers."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from aiohttp import ClientSession, web
from rich.console import Console

from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.serving import keyguard
from sparkcluster.serving.guard import GUARD_SOURCE, inner_port
from sparkcluster.serving.launch import Node, ServeArgs
from sparkcluster.serving.layout import Layout
from sparkcluster.serving.lifecycle import vllm_commands
from sparkcluster.serving.record import ServeRecord, Serving
from sparkcluster.serving.render import status_table
from sparkcluster.serving.router import replica_commands, router_command, worker_problems
from sparkcluster.serving.runtime import DockerRuntime, NodeEnv, RuntimeChoice
from sparkcluster.serving.status import (
    ClusterStatus,
    NodeStatus,
    ProcessState,
    ReplicaStatus,
    ServerStatus,
    router_workers,
)
from tests.support.strict_transport import StrictTransport

KEY = "sk-" + "GUARD" + "CANARY46"
NODES = {"spark-1": Node("spark-1", 0, "10.77.0.11", "10.77.0.11"),
         "spark-2": Node("spark-2", 1, "10.77.0.12", "10.77.0.11")}


def _session(transports: dict[str, StrictTransport] | None = None, **vars: object) -> Session:
    hosts = (Host("spark-1", "192.168.1.11", role="head", vars={"python_env": "/v", **vars}),
             Host("spark-2", "192.168.1.12", role="worker", vars={"python_env": "/v", **vars}))
    return Session(Inventory(Path("inv.yml"), "t", hosts, {}), transports=dict(transports or {}))


# --- what the guard lets through ---

def test_the_guard_forwards_the_api_only_with_the_key_and_nothing_else_at_all():
    # Failed before: no guard; vLLM answered /invocations and /tokenize without the key, the router /add_worker.
    for path in ("/invocations", "/tokenize", "/detokenize", "/pooling", "/add_worker", "/remove_worker",
                 "/list_workers", "/workers", "/get_loads", "/flush_cache", "/v1/../invocations", "/v1//x",
                 "/v1/%2e%2e/invocations", "/", "/V1/completions", "/health/../invocations"):
        assert keyguard.decide("POST", path, f"Bearer {KEY}", KEY) == 404, path
        assert keyguard.decide("POST", path, None, None) == 404, path  # without a key too: never forwarded
    assert keyguard.decide("POST", "/v1/completions", None, KEY) == 401
    assert keyguard.decide("GET", "/v1/models", "Bearer sk-other", KEY) == 401
    assert keyguard.decide("POST", "/v1/completions", f"Basic {KEY}", KEY) == 401
    assert keyguard.decide("POST", "/v1/chat/completions", f"bearer {KEY}", KEY) == 0
    assert keyguard.decide("POST", "/v1/completions", None, None) == 0  # no key given: the API is open, as vLLM's
    for path in ("/health", "/metrics", "/version"):  # status and top read these without the key
        assert keyguard.decide("GET", path, None, KEY) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_guard_streams_what_it_forwards_with_the_clients_key_and_refuses_the_rest_itself():
    seen: list[tuple[str, str | None, bytes]] = []

    async def upstream(request: web.Request) -> web.StreamResponse:
        seen.append((request.path_qs, request.headers.get("Authorization"), await request.read()))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in (b"data: one\n\n", b"data: two\n\n"):
            await response.write(word)
        return response

    async def scenario() -> list[tuple[int, str]]:
        inner = web.Application()
        inner.router.add_route("*", "/{tail:.*}", upstream)
        runner = web.AppRunner(inner)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        guard = await asyncio.start_server(lambda r, w: keyguard.handle(r, w, port, KEY), "127.0.0.1", 0,
                                           limit=keyguard.MAX_HEAD)
        guard_port = guard.sockets[0].getsockname()[1]
        answers = []
        async with ClientSession() as client:
            for path, key in (("/v1/completions?x=1", KEY), ("/v1/completions", None), ("/invocations", KEY),
                              ("/add_worker?url=http://10.0.0.9:9999", KEY), ("/health", None)):
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                body = None if path == "/health" else b'{"prompt": "p"}'  # an open path takes no body
                async with client.post(f"http://127.0.0.1:{guard_port}{path}", data=body,
                                       headers=headers) as answer:
                    answers.append((answer.status, await answer.text()))
        guard.close()
        await runner.cleanup()
        return answers

    answers = asyncio.run(scenario())
    assert answers[0] == (200, "data: one\n\ndata: two\n\n")
    assert answers[1][0] == 401 and answers[2][0] == 404 and answers[3][0] == 404 and answers[4][0] == 200
    assert "/invocations is not served here" in answers[2][1]
    # Only the keyed API request and the open /health reached the server; the body and the client's key with it.
    assert seen == [("/v1/completions?x=1", f"Bearer {KEY}", b'{"prompt": "p"}'), ("/health", None, b"")]


def _raw(port: int, data: bytes) -> bytes:
    """What a client sending `data` as is (no HTTP library to tidy it) gets back."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_the_guard_takes_one_request_a_connection_and_refuses_what_could_be_read_two_ways():
    seen: list[bytes] = []

    def serve(port_box: list[int]) -> None:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        port_box.append(server.getsockname()[1])
        while True:
            conn, _ = server.accept()
            with conn:
                seen.append(conn.recv(65536))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    box: list[int] = []
    threading.Thread(target=serve, args=(box,), daemon=True).start()
    while not box:
        time.sleep(0.01)

    async def scenario() -> list[bytes]:
        guard = await asyncio.start_server(lambda r, w: keyguard.handle(r, w, box[0], KEY), "127.0.0.1", 0,
                                           limit=keyguard.MAX_HEAD)
        port = guard.sockets[0].getsockname()[1]
        auth = f"Authorization: Bearer {KEY}\r\n".encode()
        requests = [
            # a second request kept on the connection after a permitted one never reaches the server
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
            b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
            b"POST /v1/completions HTTP/1.1\r\n" + auth + b"Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}",
            b"POST /v1/completions HTTP/1.1\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\n" + auth + b"X: a\nAuthorization: Bearer other\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\n" + auth + auth + b"\r\n",
            b"GET http://10.0.0.9/v1/models HTTP/1.1\r\n" + auth + b"\r\n",
            # the open paths need no key, so they take no body: 60 MiB bodies read by anyone exhausted memory
            b"POST /health HTTP/1.1\r\nContent-Length: 62914560\r\n\r\n",  # refused before a byte of it
            "POST /v1/completions HTTP/1.1\r\nContent-Length: \u00b2\r\n\r\n".encode("latin-1"),  # isdigit() but no int
        ]
        answers = [await asyncio.to_thread(_raw, port, r) for r in requests]
        guard.close()
        return answers

    first, *refused = asyncio.run(scenario())
    assert first.startswith(b"HTTP/1.1 200 OK") and first.endswith(b"ok") and b"invocations" not in first
    assert [a.split(b"\r\n", 1)[0] for a in refused] == [b"HTTP/1.1 400 Bad Request", b"HTTP/1.1 411 Length Required",
                                                         b"HTTP/1.1 400 Bad Request", b"HTTP/1.1 400 Bad Request",
                                                         b"HTTP/1.1 404 Not Found", b"HTTP/1.1 413 Payload Too Large",
                                                         b"HTTP/1.1 400 Bad Request"]
    (forwarded,) = seen  # only the first request reached the server, asked to close after one answer
    assert forwarded.startswith(b"GET /v1/models HTTP/1.1\r\n") and b"connection: close" in forwarded.lower()


CHILD = ("import http.server, sys\n"
         "class H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n"
         "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
         "        self.wfile.write(b'ok')\n"
         "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return e.code
    except urllib.error.URLError:
        return 0  # nothing answers (yet)


def test_the_guard_program_starts_its_child_and_stops_it_with_itself():
    """As serve runs it: `python3 -c SOURCE --listen ... --upstream ... -- CHILD`; SIGTERM (the runtimes' stop) ends
    the child too, and a child that exits ends the guard with its status."""
    port, inner = _free_port(), _free_port()
    guard = subprocess.Popen([sys.executable, "-c", GUARD_SOURCE, "--listen", f"127.0.0.1:{port}", "--upstream",
                              str(inner), "--", sys.executable, "-c", CHILD, str(inner)],
                             env={**os.environ, "VLLM_API_KEY": KEY}, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(100):
            if _get(f"http://127.0.0.1:{port}/health") == 200:
                break
            time.sleep(0.1)
        assert _get(f"http://127.0.0.1:{port}/health") == 200
        assert _get(f"http://127.0.0.1:{port}/list_workers") == 404
        assert _get(f"http://127.0.0.1:{port}/v1/models") == 401
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(timeout=30) == 128 + signal.SIGTERM  # the child's status, ended by the guard's SIGTERM
        stderr = guard.stderr.read() if guard.stderr else ""
        assert "keyguard: 127.0.0.1:" in stderr and KEY not in stderr
        assert _get_refused(f"http://127.0.0.1:{inner}/health")  # the child is gone with it
    finally:
        guard.kill()

    guard = subprocess.run([sys.executable, "-c", GUARD_SOURCE, "--listen", f"127.0.0.1:{_free_port()}",
                            "--upstream", str(inner), "--", sys.executable, "-c", "raise SystemExit(7)"],
                           capture_output=True, timeout=60)
    assert guard.returncode == 7


def _get_refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
    except urllib.error.URLError as e:
        return isinstance(e.reason, ConnectionRefusedError)
    return False


# --- the command lines ---

def test_the_router_and_each_replica_listen_on_the_loopback_behind_the_guard_which_gets_the_key_off_the_line():
    session = _session()
    runtime = RuntimeChoice("host", caches=False)
    placements = Layout(2).place(list(NODES), 8000)
    args = ServeArgs("org/m", tp=1, port=8000, served_name="m", env={"VLLM_API_KEY": KEY})
    replicas = replica_commands(session, runtime, NODES, placements, args)
    router = router_command(session, runtime, NODES, placements, args)["spark-1"]
    assert inner_port(8000) == 28000 and inner_port(60000) == 40000
    for command, public, server in ((replicas["spark-1"], 8001, "vllm serve org/m --tensor-parallel-size 1 --host "
                                     "127.0.0.1 --port 28001"),
                                    (replicas["spark-2"], 8002, "vllm serve org/m --tensor-parallel-size 1 --host "
                                     "127.0.0.1 --port 28002"),
                                    (router, 8000, "vllm-router --host 127.0.0.1 --port 28000 --worker-urls "
                                     "http://10.77.0.11:8001 http://10.77.0.12:8002 ")):
        assert f"python3 -c {GUARD_SOURCE[:20]}" in command.script.replace("'", "")
        assert f" --listen 0.0.0.0:{public} --upstream {public + 20000} -- {server}" in command.script
        assert "0.0.0.0" not in command.script.split(f"--upstream {public + 20000} -- ", 1)[1]  # the server: loopback
        assert KEY not in command.script and command.stdin and f"VLLM_API_KEY={KEY}" in command.stdin
    assert "--api-key" not in router.script  # vllm-router's --api-key checks no client: it sends the key to workers
    # docker: the router's container takes the key by name from the reader's environment
    docker = DockerRuntime("vllm-node").start_router(["python3", "-c", "x"], NodeEnv("e", {}, {"VLLM_API_KEY": KEY}))
    assert "docker run -d --rm --network host --name vllm_router -e VLLM_API_KEY vllm-node python3" in docker.script
    assert KEY not in docker.script


def test_a_single_engine_answers_behind_the_guard_too_and_its_other_ranks_serve_no_http():
    # Failed before: one engine's vLLM answered /invocations on 0.0.0.0:8000 without the key (issue 46, F1).
    session = _session()
    runtime = RuntimeChoice("host", caches=False)
    args = ServeArgs("org/m", tp=2, port=8000, served_name="m", env={"VLLM_API_KEY": KEY})
    ray = vllm_commands(session, runtime, NODES, "ray", args)
    native = vllm_commands(session, runtime, NODES, "native", args)
    for command in (ray["spark-1"], native["spark-1"]):
        assert " --listen 0.0.0.0:8000 --upstream 28000 -- vllm serve org/m --tensor-parallel-size 2" in command.script
        assert "--host 127.0.0.1 --port 28000 --served-model-name m" in command.script and KEY not in command.script
    assert list(ray) == ["spark-1"]  # Ray's ranks answer no HTTP
    assert "keyguard" not in native["spark-2"].script and "--headless" in native["spark-2"].script
    assert "python3 -c" not in native["spark-2"].script and "--port" not in native["spark-2"].script


# --- status: the router's workers against the record ---

def test_a_stranger_or_a_missing_replica_among_the_routers_workers_is_named():
    expected = {"http://10.77.0.11:8001": "replica 0 on spark-1", "http://10.77.0.12:8002": "replica 1 on spark-2"}
    assert worker_problems(["http://10.77.0.11:8001", "http://10.77.0.12:8002/"], expected) == []
    stranger, = worker_problems(["http://10.77.0.11:8001", "http://10.77.0.12:8002", "http://192.168.1.66:9999"],
                                expected)
    assert stranger.startswith("the router sends requests to 'http://192.168.1.66:9999', a worker serve did not start")
    missing, = worker_problems(["http://10.77.0.11:8001"], expected)
    assert missing.startswith("replica 1 on spark-2 (http://10.77.0.12:8002) is not among the router's workers")
    # a replica whose head is outside --limit: any worker at its port stands for it
    assert worker_problems(["http://10.77.0.11:8001", "http://10.77.0.99:8002"],
                           {"http://10.77.0.11:8001": "replica 0 on spark-1"}, [8002]) == []


def _routed(placements: tuple) -> Serving:
    return Serving("org/m", "m", 8000, "http://192.168.1.11:8000/v1", 1, "default", (), None, 1, placements, None)


def test_status_reads_the_routers_workers_on_the_heads_loopback_and_fails_on_a_stranger():
    # Failed before: `status` said the router and both replicas were healthy, exit 0, with a stranger among them.
    placements = Layout(2).place(list(NODES), 8000)
    listed = {"urls": ["http://10.77.0.11:8001", "http://10.77.0.12:8002", "http://192.168.1.66:9999"]}
    head = StrictTransport("spark-1").expect(re.compile(r"python3 -c .* http://127\.0\.0\.1:28000/list_workers"),
                                             stdout=json.dumps(listed))
    session = _session({"spark-1": head})
    workers, problems = router_workers(session, RuntimeChoice("host", caches=False), _routed(placements), NODES)
    head.verify()
    assert workers == tuple(listed["urls"]) and len(problems) == 1 and "'http://192.168.1.66:9999'" in problems[0]
    nodes = {"spark-1": NodeStatus(processes={"main": ProcessState.RUNNING, "router": ProcessState.RUNNING}),
             "spark-2": NodeStatus(processes={"main": ProcessState.RUNNING})}
    record = ServeRecord("host", "native", "vllm-node", ("spark-1", "spark-2"), _routed(placements))
    state = ClusterStatus(record, nodes, router_problems=problems, router_workers=workers)
    assert not state.healthy  # status exits 1
    assert state.to_json()["router"] == {"workers": listed["urls"], "problems": list(problems)}
    healthy = ClusterStatus(record, nodes, router_workers=workers[:2])
    assert healthy.healthy
    out = io.StringIO()
    server = ServerStatus("http://192.168.1.11:8000/v1", "org/m", "m", 200, ("m",))
    replicas = tuple(ReplicaStatus(p, f"http://192.168.1.1{p.index + 1}:{p.port}/v1", 200) for p in placements)
    status_table(Console(file=out, width=400), replace(state, server=server, replicas=replicas))
    assert "problem: the router sends requests to 'http://192.168.1.66:9999', a worker serve did not start" \
        in out.getvalue(), out.getvalue()


def test_status_names_a_router_whose_workers_cannot_be_read():
    placements = Layout(2).place(list(NODES), 8000)
    head = StrictTransport("spark-1").expect(re.compile(r"list_workers"), exit_code=1,
                                             stderr="urllib.error.URLError: <urlopen error [Errno 111] refused>")
    workers, problems = router_workers(_session({"spark-1": head}), RuntimeChoice("host", caches=False),
                                       _routed(placements), NODES)
    assert workers is None and problems[0].startswith("the router's workers could not be read on spark-1: ")
    head = StrictTransport("spark-1").expect(re.compile(r"list_workers"), stdout="<html>not json</html>")
    workers, problems = router_workers(_session({"spark-1": head}), RuntimeChoice("host", caches=False),
                                       _routed(placements), NODES)
    assert workers is None and "answered no list of workers" in problems[0]
