"""Issue 48 on the simulator with the real CPU vLLM: the supervisor serve installs on the head (a systemd unit, which
the simulator's systemd runs as a real one would) notices each fault and brings the serve back, with no command
from this machine. Its own cluster, so these proofs run beside test_serve_host_vllm.py's, not after them."""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml

from sparkcluster.serving.incidents import EVENTS_FILE, STATE_FILE, parse_events, parse_state
from sparkcluster.serving.readiness import http
from sparkcluster.sim import SimCluster
from tests.support.helpers import run_cli, ssh
from tests.support.sim_serving import MODEL, VLLM_FLAGS, sc, vllm_pair

pytestmark = [pytest.mark.sim, pytest.mark.slow]
API_KEY = "sk-" + "SUPERVISED" + "CANARY48"  # split: the test's own argv never holds it whole


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[SimCluster]:
    with vllm_pair(tmp_path_factory.mktemp("cfg"), "supervise") as c:
        yield c


# A policy for the tests: a round every 2 s, a probe every 3 s that waits 5 s, two misses in a row, a lost node
# awaited 6 s. The defaults (15 s, 30 s, 20 s, 60 s) notice within 100 s; these within 20 s, so the proofs below cost
# seconds, not minutes (tests/unit/supervise walks the defaults).
QUICK_POLICY = {"interval_s": 2, "probe_every_s": 3, "probe_timeout_s": 5, "misses": 2, "backoff_s": [0, 5, 10],
                "max_restarts": 2, "node_grace_s": 6, "boot_grace_s": 6}
RECEIVER = """
import http.server, sys
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers['Content-Length']))
        with open(sys.argv[1], 'ab') as f:
            f.write(body + b'\\n')
        self.send_response(204)
        self.end_headers()
http.server.HTTPServer(('127.0.0.1', 9977), Receiver).serve_forever()
"""


@contextmanager
def supervise_policy(c: SimCluster, policy: dict) -> Iterator[None]:
    text = c.inventory_path.read_text()
    doc = yaml.safe_load(text)
    doc["vars"]["supervise"] = policy
    c.inventory_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        yield
    finally:
        c.inventory_path.write_text(text)


def incidents(c: SimCluster) -> list[dict]:
    """Every incident the head's supervisor recorded, oldest first (the history outlives each serve)."""
    said = sc(c, "events", "--json")
    assert said.returncode == 0, said.stdout + said.stderr
    return json.loads(said.stdout)["events"]


# The waits below poll the head's files over one SSH command each (a few hundredths of a second of CPU), and what
# they then assert is read with the CLI (`events`, `supervise status`) once: a CLI run every 2 s took ~1 s of CPU
# each, from the vLLM being restarted on a 2-core machine.
def recorded(c: SimCluster) -> list[dict]:
    """The incidents in the head's events file, as `events --json` lists them."""
    return [i.to_json() for i in parse_events(ssh(c, "spark-1", f"cat ~/{EVENTS_FILE} 2>/dev/null; true").stdout)]


def recorded_state(c: SimCluster) -> str | None:
    """The state in the head's state file, as `supervise status` tells it."""
    state = parse_state(ssh(c, "spark-1", f"cat ~/{STATE_FILE} 2>/dev/null; true").stdout)
    return None if state is None else str(state.state)


def wait_for_incident(c: SimCluster, count: int, base: int, timeout_s: float = 400) -> list[dict]:
    """The incidents after the first `base` (as `events --json` lists them), once `count` of them are actions
    (not reports)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len([e for e in recorded(c)[base:] if e["outcome"] != "reported"]) >= count:
            events = incidents(c)[base:]
            assert len([e for e in events if e["outcome"] != "reported"]) >= count, events
            return events
        time.sleep(1)
    raise AssertionError(f"no incident #{count} within {timeout_s} s: {sc(c, 'events').stdout}\n"
                         + ssh(c, "spark-1", "tail -n 40 ~/.config/sparkcluster/supervisor/supervisor.log").stdout)


def test_the_supervisor_serves_again_a_tp2_whose_worker_died_or_whose_engine_wedged(cluster):
    """Issue 48, proofs 1 and 2: serve installs the supervisor on the head as a systemd unit (the simulator's
    systemd runs the same unit file). `kill -9` of spark-2's vLLM: noticed, the TP 2 layout served again, answering,
    one incident with both times, posted to --notify (a receiver on the head). `kill -STOP` of the head's engine
    core (/health still 200): the probe times out, wedged, served again. `down` stops the supervisor first."""
    receiver_log = "/tmp/sparkcluster-notify.jsonl"
    cluster.exec_in("spark-1", ["sh", "-c", f"setsid python3 -c {shlex.quote(RECEIVER)} {receiver_log} "
                                            "</dev/null >/dev/null 2>&1 &"])
    body = {"model": MODEL, "prompt": "The cluster of sparks", "max_tokens": 2, "temperature": 0}
    head = cluster.topology.hosts[0]
    endpoint = f"http://{head.mgmt_ip}:8000/v1"
    with supervise_policy(cluster, QUICK_POLICY):
        try:
            began = time.monotonic()
            served = sc(cluster, "serve", "--launcher", "native", "--tp", "2", "--model", MODEL, "--no-verify",
                        "--json", "--notify", "http://127.0.0.1:9977/hook", *VLLM_FLAGS, "--api-key", API_KEY)
            serve_s = time.monotonic() - began  # the first serve (staging the model included): at least a warm one
            assert served.returncode == 0, served.stderr[-3000:]
            assert json.loads(served.stdout)["supervisor"]["state"] == "watching", served.stdout[-1000:]
            unit = ssh(cluster, "spark-1", "systemctl is-active sparkcluster-supervisor.service; "
                                           "systemctl is-enabled sparkcluster-supervisor.service").stdout.split()
            assert unit == ["active", "enabled"], unit

            base = len(incidents(cluster))
            ssh(cluster, "spark-2", 'kill -KILL -- -"$(cat ~/.cache/sparkcluster/serve/main.pid)"')
            killed = time.monotonic()
            first = wait_for_incident(cluster, 1, base)[-1]
            assert (first["target"], first["seen"], first["action"], first["outcome"]) == (
                "vLLM", "engine-dead", "restart", "recovered"), first
            assert 0 <= first["detected_s"] < 60 and first["recovered_s"] > 0, first
            code, text = http(f"{endpoint}/completions", body, timeout=60, api_key=API_KEY)
            assert code == 200, text
            assert time.monotonic() - killed < serve_s + 60  # the bound: the warm serve time plus 60 s
            kept = ssh(cluster, "spark-1", "cd ~/.config/sparkcluster/supervisor && cat serve.json supervisor.log").stdout
            assert API_KEY not in kept and "--api-key" not in kept, kept[-2000:]  # the restart's argv held no key
            posted = [json.loads(line) for line in ssh(cluster, "spark-1", f"cat {receiver_log}").stdout.splitlines()]
            assert posted and posted[0]["seen"] == "engine-dead" and posted[0]["text"].startswith("sparkcluster: "), \
                posted

            core = ssh(cluster, "spark-1", "pgrep -f 'VLLM::EngineCore|EngineCore' | head -n 1").stdout.strip()
            assert core, ssh(cluster, "spark-1", "ps -eo pid,args").stdout
            ssh(cluster, "spark-1", f"kill -STOP {core}")
            assert http(f"http://{head.mgmt_ip}:8000/health", timeout=10)[0] == 200  # /health cannot see a wedge
            second = wait_for_incident(cluster, 2, base)[-1]
            assert (second["seen"], second["action"], second["outcome"]) == ("wedged", "restart", "recovered"), second
            code, text = http(f"{endpoint}/completions", body, timeout=60, api_key=API_KEY)
            assert code == 200, text

            status = json.loads(sc(cluster, "status", "--json").stdout)
            assert status["supervisor"]["active"] and status["supervisor"]["state"]["state"] == "watching", status
            assert [i["seen"] for i in status["supervisor"]["incidents"]][-2:] == ["engine-dead", "wedged"]
            since = json.loads(sc(cluster, "events", "--json", "--since", "1h").stdout)["events"]
            assert [e["seen"] for e in since][-2:] == ["engine-dead", "wedged"]
            assert json.loads(sc(cluster, "events", "--json", "--since", "2099-01-01T00:00:00").stdout)["events"] == []

            # A wrong key in the probe: reported once as a configuration error, and nothing restarted for it.
            secrets = "~/.config/sparkcluster/supervisor/secrets.env"
            restart_unit = "sudo systemctl restart sparkcluster-supervisor.service"
            ssh(cluster, "spark-1", f"cp {secrets} {secrets}.good && echo VLLM_API_KEY=wrong > {secrets} && {restart_unit}")
            wait_until("the refused key reported", lambda: any(e["seen"] == "unauthorized"
                                                               for e in recorded(cluster)[base:]))
            time.sleep(8)  # four rounds and two probes more: still nothing restarted
            events = incidents(cluster)[base:]
            assert [(e["seen"], e["action"], e["outcome"]) for e in events[2:]] == [
                ("unauthorized", "none", "reported")], events

            # An engine that dies at every start (a flag vLLM refuses, in what the supervisor serves): two restarts,
            # then it gives up with vLLM's own reason, and leaves the cluster as it is.
            spec = "~/.config/sparkcluster/supervisor/serve.json"
            edit = ("import json, os, sys; p = os.path.expanduser(sys.argv[1]); d = json.load(open(p)); "
                    "d['remote'] += ['--max-model-len', '99999999']; json.dump(d, open(p, 'w'))")
            # The breaker's count is kept across the supervisor's restarts; a new serve's install clears it, as here.
            ssh(cluster, "spark-1", f"mv {secrets}.good {secrets} && python3 -c {shlex.quote(edit)} {spec} && "
                                    f"rm -f ~/.config/sparkcluster/supervisor/breaker.json && {restart_unit}")
            ssh(cluster, "spark-2", 'kill -KILL -- -"$(cat ~/.cache/sparkcluster/serve/main.pid)"')
            wait_until("gave up", lambda: recorded_state(cluster) == "gave-up", timeout_s=600)
            assert supervisor_state(cluster) == "gave-up"
            events = incidents(cluster)[base:]
            assert [(e["action"], e["outcome"]) for e in events[3:]] == [
                ("restart", "failed"), ("restart", "failed"), ("gave-up", "gave-up")], events
            assert "max_model_len" in events[-1]["root_cause"] or "max-model-len" in events[-1]["root_cause"], events[-1]
            said = sc(cluster, "status").stdout
            assert "gave-up" in said and "2 restarts failed in a row (the limit is 2)" in said, said
        finally:
            down = sc(cluster, "down", "--json")
            cluster.exec_in("spark-1", ["pkill", "-f", "sparkcluster-notify"])
    assert down.returncode == 0, down.stderr
    assert ssh(cluster, "spark-1", "systemctl is-active sparkcluster-supervisor.service || true").stdout.strip() == \
        "inactive"


@contextmanager
def client_loop(endpoint: str, body: dict, api_key: str | None = None) -> Iterator[list[int]]:
    """Requests sent one after another for as long as the block runs: the status of each, in order."""
    codes: list[int] = []
    done = threading.Event()

    def send() -> None:
        while not done.is_set():
            sent = time.monotonic()
            code, text = http(f"{endpoint}/completions", body, timeout=120, api_key=api_key)
            codes.append(code)
            if code != 200:
                print(f"client loop: {code} at {sent:.1f}-{time.monotonic():.1f}: {text[:300]}")
            time.sleep(0.2)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield codes
    finally:
        done.set()
        thread.join(timeout=150)


def supervisor_state(c: SimCluster) -> str | None:
    """What the head's supervisor says it is doing (`supervise status` asks the head alone)."""
    said = run_cli("supervise", "status", "-i", str(c.inventory_path), "--json")
    assert said.returncode == 0, said.stdout + said.stderr
    state = json.loads(said.stdout)["supervisor"]["state"]
    return state["state"] if state else None


def wait_until(what: str, condition, timeout_s: float = 400, every_s: float = 2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_two_supervised_replicas_answer_every_request_while_a_node_is_off_and_come_back_after_a_power_cut(cluster):
    """Issue 48, proofs 3 and 5. Two replicas, a client loop sending requests throughout: `sim power-off spark-2`.
    Every request is answered (the router keeps clients off the lost replica), the supervisor says degraded; after
    `sim boot spark-2` two healthy replicas again, with no command (that replica restarted alone). Then a power
    cut of the head: after `sim boot spark-1`, the head's systemd starts the supervisor, which serves again from
    the record, with no command from this machine."""
    head = cluster.topology.hosts[0]
    endpoint = f"http://{head.mgmt_ip}:8000/v1"
    body = {"model": MODEL, "prompt": "The cluster of sparks", "max_tokens": 2, "temperature": 0}

    def replicas_healthy() -> bool:
        state = json.loads(sc(cluster, "status", "--json").stdout)
        return [r["healthy"] for r in state.get("replicas", [])] == [True, True]

    with supervise_policy(cluster, QUICK_POLICY):
        try:
            served = sc(cluster, "serve", "--replicas", "2", "--model", MODEL, "--no-verify", "--json", *VLLM_FLAGS)
            assert served.returncode == 0, served.stderr[-3000:]
            base = len(incidents(cluster))
            with client_loop(endpoint, body) as codes:
                time.sleep(3)
                print(f"power-off spark-2 at {time.monotonic():.1f}")
                cluster.power_off("spark-2")
                wait_until("the supervisor says degraded", lambda: recorded_state(cluster) == "degraded")
                assert supervisor_state(cluster) == "degraded"
                events = incidents(cluster)[base:]
                assert [(e["target"], e["seen"], e["action"]) for e in events] == [
                    ("replica 1", "node-down", "none")], events
                time.sleep(5)
                print(f"boot spark-2 at {time.monotonic():.1f}")
                cluster.boot("spark-2")
                wait_until("two healthy replicas again", replicas_healthy)
                print(f"two healthy replicas at {time.monotonic():.1f}")
                time.sleep(3)
            assert len(codes) > 20 and set(codes) == {200}, codes
            events = incidents(cluster)[base:]
            assert ("replica 1", "engine-dead", "restart-replica", "recovered") in [
                (e["target"], e["seen"], e["action"], e["outcome"]) for e in events], events

            cluster.power_off("spark-1")
            cluster.boot("spark-1")
            wait_until("the endpoint answers after the head's power cut",
                       lambda: http(f"{endpoint}/completions", body, timeout=30)[0] == 200, timeout_s=500)
            assert replicas_healthy()
            last = incidents(cluster)[-1]
            assert (last["action"], last["outcome"]) == ("restart", "recovered"), last
        finally:
            down = sc(cluster, "down", "--json")
    assert down.returncode == 0, down.stderr


def test_a_supervised_tp2_whose_worker_is_off_for_good_serves_tp1_on_the_head_and_says_degraded(cluster):
    """Issue 48, proof 4: TP 2 with spark-2 off for good: the supervisor serves the largest layout that fits on the
    node left (the tiny model fits one node: TP 1 on spark-1), which answers, and status says degraded."""
    head = cluster.topology.hosts[0]
    endpoint = f"http://{head.mgmt_ip}:8000/v1"
    body = {"model": MODEL, "prompt": "The cluster of sparks", "max_tokens": 2, "temperature": 0}
    with supervise_policy(cluster, QUICK_POLICY):
        try:
            served = sc(cluster, "serve", "--launcher", "native", "--tp", "2", "--model", MODEL, "--no-verify",
                        "--json", *VLLM_FLAGS)
            assert served.returncode == 0, served.stderr[-3000:]
            base = len(incidents(cluster))
            cluster.power_off("spark-2")
            first = wait_for_incident(cluster, 1, base)[-1]
            assert (first["target"], first["seen"], first["action"], first["outcome"]) == (
                "vLLM", "node-down", "degrade", "recovered"), first
            assert "TP 1 on spark-1" in first["text"], first
            code, text = http(f"{endpoint}/completions", body, timeout=60)
            assert code == 200, text
            state = json.loads(sc(cluster, "status", "--limit", "spark-1", "--json").stdout)
            assert state["state"]["serving"]["tp"] == 1 and state["state"]["nodes"] == ["spark-1"], state["state"]
            told = state["supervisor"]["state"]
            assert (told["state"], told["reason"]) == ("degraded", "serving without spark-2"), told
        finally:
            down = sc(cluster, "down", "--limit", "spark-1", "--json")
            if not cluster.is_running(cluster.host("spark-2")):
                cluster.boot("spark-2")
    assert down.returncode == 0, down.stderr
