"""`monitor up`'s pieces on this machine (the --here place), for real: the exporter as the node runs it (the .pyz,
started detached), a vLLM /metrics on loopback (a real capture, its counters rising per scrape), and the
distribution's Prometheus with the written configuration and rules. Every target comes up; a second `up` changes
nothing; a changed configuration is reloaded; every panel of the sparkcluster dashboard returns series; `down`
stops both and keeps Prometheus' data unless purged.

The node the exporter reads is made of files (tests/support/monitor.py): a fake nvidia-smi and journalctl on
PATH, a sysfs tree (SPARKCLUSTER_SYS_ROOT), the last verify and the supervisor's files under a temporary HOME."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sparkcluster.monitor import deploy
from sparkcluster.monitor.alerting import alertmanager_config
from sparkcluster.monitor.config import prometheus_config
from sparkcluster.monitor.packaged import dashboard_path, rule_paths
from sparkcluster.monitor.place import LocalPlace
from sparkcluster.monitor.targets import Target, Targets
from sparkcluster.serving.incidents import EVENTS_FILE, STATE_FILE
from tests.support.monitor import (
    GPU_HOT,
    KERNEL_JOURNAL,
    MEMINFO,
    VERIFY,
    RisingVllm,
    build_sysfs,
    free_port,
    incident,
    write_file,
)

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                reason="Prometheus missing: apt-get install prometheus")
@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "home"
    bin_dir = tmp_path / "bin"
    write_file(bin_dir / "nvidia-smi", f"#!/bin/sh\necho '{GPU_HOT.strip()}'\n")
    journal = tmp_path / "journal.txt"
    journal.write_text(KERNEL_JOURNAL)
    write_file(bin_dir / "journalctl", f"#!/bin/sh\ncase \"$*\" in *'-b -1'*) exit 1 ;; esac\ncat {journal}\n")
    for tool in ("nvidia-smi", "journalctl"):
        (bin_dir / tool).chmod(0o755)
    build_sysfs(tmp_path / "sys")
    write_file(tmp_path / "proc/meminfo", MEMINFO)
    write_file(home / ".config/sparkcluster/last-verify.json", json.dumps(VERIFY))
    write_file(home / STATE_FILE, json.dumps(
        {"version": 1, "state": "watching", "since": "2026-12-01T10:00:00Z", "restarts_last_hour": 1, "reason": None}))
    write_file(home / EVENTS_FILE, json.dumps(incident()) + "\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("SPARKCLUSTER_SYS_ROOT", str(tmp_path / "sys"))
    monkeypatch.setenv("SPARKCLUSTER_PROC_ROOT", str(tmp_path / "proc"))
    place = LocalPlace()
    yield home
    deploy.stop(place, "alertmanager", purge=True)
    deploy.stop(place, "prometheus", purge=True)
    deploy.stop(place, "exporter", purge=True)


@pytest.fixture
def vllm() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RisingVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def query(listen: str, expr: str) -> list[dict[str, Any]]:
    url = f"http://{listen}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads(dashboard_path().read_text())
    return [(panel["title"], target["expr"]) for panel in doc["panels"] for target in panel.get("targets", [])]


def until(what: str, check: Any, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds:g} s")
        time.sleep(1)


def test_monitor_here_for_real(node: Path, vllm: str) -> None:
    place = LocalPlace()
    port, listen = free_port(), f"127.0.0.1:{free_port()}"
    exporter = f"127.0.0.1:{port}"

    first = deploy.exporter_up(place, sys.executable, "127.0.0.1", port, check=False)
    assert first.status == "changed", first
    assert deploy.exporter_up(place, sys.executable, "127.0.0.1", port, check=False).status == "ok"

    targets = Targets((Target("sparkcluster-node", exporter, (("node", "spark-1"),)),),
                      (Target("vllm", vllm, (("node", "spark-1"), ("replica", "vLLM"), ("model", "tiny"))),),
                      supervisor=Target("sparkcluster-supervisor", exporter, (("node", "spark-1"),), "/supervisor"))
    rules = {f"rules/{p.name}": p.read_bytes() for p in rule_paths()}
    files = {"prometheus.yml": prometheus_config(targets, sorted(rules), interval_s=1).encode(), **rules}
    assert deploy.prometheus_up(place, files, listen, check=True).status == "would change"
    up = deploy.prometheus_up(place, files, listen, check=False)
    assert up.status == "changed", up
    assert deploy.prometheus_up(place, files, listen, check=False).status == "ok"

    health = until("every target up", lambda: (lambda h: isinstance(h, list) and len(h) == 3 and all(
        t["health"] == "up" for t in h) and h)(deploy.targets_health(place, listen)))
    assert {(t["job"], t["node"]) for t in health} == {("sparkcluster-node", "spark-1"), ("vllm", "spark-1"),
                                                       ("sparkcluster-supervisor", "spark-1")}

    # the hot GPU of the node (92 C, hw_thermal_slowdown) as Prometheus stores it, with the node's label
    temp = until("the GPU's temperature", lambda: query(listen, "sparkcluster_gpu_temperature_celsius"))
    assert temp[0]["metric"]["node"] == "spark-1" and temp[0]["value"][1] == "92"
    # vLLM's own dashboards filter on job, instance, model_name and engine: each is there, beside ours
    running = until("vLLM's running requests", lambda: query(listen, "vllm:num_requests_running"))
    assert {"job", "instance", "model_name", "engine", "node", "replica", "model"} <= set(running[0]["metric"])
    assert running[0]["metric"]["model_name"] == "local/tiny-llama" and running[0]["metric"]["job"] == "vllm"
    # a figure under Ray's stat logger's name is stored under vLLM's own
    renamed = until("Ray's name read as vLLM's", lambda: query(listen, "vllm:kv_offload_load_bytes_total"))
    assert renamed[0]["metric"]["replica"] == "vLLM" and not query(listen, "ray_vllm_kv_offload_load_bytes_total")
    # the served engine's token counter rises between scrapes
    until("tokens per second", lambda: [r for r in query(listen, "rate(vllm:generation_tokens_total[10s])")
                                        if float(r["value"][1]) > 0])

    deadline = time.monotonic() + 60  # the recording rules' first evaluation: within their 15 s interval
    while missing := [title for title, expr in dashboard_queries() if not query(listen, expr)]:
        assert time.monotonic() < deadline, f"panels whose query returns no series: {missing}"
        time.sleep(1)

    # a changed configuration is written and Prometheus reloads it in place
    changed = {**files, "prometheus.yml": files["prometheus.yml"] + b"# changed\n"}
    again = deploy.prometheus_up(place, changed, listen, check=False)
    assert again.status == "changed" and "reload" in again.reason

    data = node / deploy.PROMETHEUS_DIR / "data"
    stopped = deploy.stop(place, "prometheus", purge=False)
    assert stopped.status == "changed" and "data kept" in stopped.reason and data.is_dir()
    assert not deploy.running(place, "prometheus")
    assert deploy.stop(place, "exporter", purge=False).status == "changed"
    assert deploy.stop(place, "prometheus", purge=True).reason.endswith("its data removed")
    assert not data.exists()


class _Webhook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Webhook.received.append({"path": self.path, "doc": json.loads(body)})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass


@pytest.mark.skipif(shutil.which("prometheus-alertmanager") is None or shutil.which("amtool") is None,
                    reason="Alertmanager missing: apt-get install prometheus-alertmanager")
def test_notify_posts_a_firing_alert_to_the_webhook(node: Path) -> None:
    """`up --notify URL`'s pieces: the supervisor gave up on spark-1; Prometheus fires SparkSupervisorGaveUp, its
    Alertmanager posts it to the webhook, with the summary naming the node; the URL's token is in no outcome."""
    write_file(node / STATE_FILE, json.dumps(
        {"version": 1, "state": "gave-up", "since": "2026-12-01T10:00:00Z", "restarts_last_hour": 5, "reason": None}))
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    place = LocalPlace()
    try:
        port, listen = free_port(), f"127.0.0.1:{free_port()}"
        assert deploy.exporter_up(place, sys.executable, "127.0.0.1", port, check=False).status == "changed"
        token = "T000-B000-" + "HOOKTOKEN"
        url = f"http://127.0.0.1:{hook.server_address[1]}/hooks/{token}"
        manager = deploy.alertmanager(f"127.0.0.1:{free_port()}")
        sent = deploy.daemon_up(place, manager, {"alertmanager.yml": alertmanager_config(url).encode()}, check=False)
        assert sent.status == "changed", sent
        assert oct((node / deploy.ALERTMANAGER_DIR / "alertmanager.yml").stat().st_mode & 0o777) == "0o600"
        targets = Targets((Target("sparkcluster-node", f"127.0.0.1:{port}", (("node", "spark-1"),)),),
                          supervisor=Target("sparkcluster-supervisor", f"127.0.0.1:{port}", (("node", "spark-1"),),
                                            "/supervisor"))
        rules = {f"rules/{p.name}": p.read_bytes() for p in rule_paths()}
        config = prometheus_config(targets, sorted(rules), interval_s=1, alertmanager=manager.listen)
        up = deploy.prometheus_up(place, {"prometheus.yml": config.encode(), **rules}, listen, check=False)
        assert up.status == "changed", up
        assert token not in json.dumps([sent.to_json(), up.to_json()])

        def posted() -> list[dict[str, Any]]:
            return [a for r in _Webhook.received for a in r["doc"]["alerts"]
                    if a["labels"]["alertname"] == "SparkSupervisorGaveUp"]

        alerts = until("the webhook to receive SparkSupervisorGaveUp", posted, 90)
        assert alerts[0]["status"] == "firing" and alerts[0]["labels"]["node"] == "spark-1"
        assert "spark-1 gave up" in alerts[0]["annotations"]["summary"]
        assert _Webhook.received[0]["path"] == f"/hooks/{token}"
        assert deploy.stop(place, "alertmanager", purge=True).status == "changed"
    finally:
        hook.shutdown()
        hook.server_close()


def test_check_changes_nothing_and_failures_name_their_cause(node: Path) -> None:
    """--check writes and starts nothing; a configuration promtool rejects is never started, with promtool's
    words; an exporter that cannot start says why (its log's last lines)."""
    place = LocalPlace()
    port, listen = free_port(), f"127.0.0.1:{free_port()}"
    would = deploy.exporter_up(place, sys.executable, "127.0.0.1", port, check=True)
    assert would.status == "would change" and "not installed" in would.reason
    assert not (node / deploy.MONITOR_DIR).exists()

    broken = {"prometheus.yml": b"scrape_configs:\n  - job_name: x\n    static_configs: [{targets: ['a:1']}]\n"
                                b"    bogus_field: 1\n"}
    failed = deploy.prometheus_up(place, broken, listen, check=False)
    assert failed.status == "failed" and "promtool rejects the configuration" in failed.reason, failed
    assert "bogus_field" in failed.reason
    assert not deploy.running(place, "prometheus")

    bad = deploy.exporter_up(place, "/nonexistent/python3", "127.0.0.1", port, check=False)
    assert bad.status == "failed" and "starting it failed" in bad.reason, bad
    assert "/nonexistent/python3" in bad.reason  # the shell's own words, from the exporter's log
