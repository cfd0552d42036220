"""What the supervisor writes and posts, and the serve it runs again: incidents and state as JSON and back, a torn
last line skipped, the serve's flags as the head repeats them, a degraded serve's, the unit file, and an incident
POSTed to a real receiver on loopback."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkcluster.serving.incidents import (
    Action,
    Incident,
    Outcome,
    Seen,
    SupervisorState,
    WatchState,
    parse_events,
    parse_state,
)
from sparkcluster.serving.supervisor_unit import SupervisorSpec, environment_line, serve_argv_for_head, unit_text
from sparkcluster.supervise.act import first_error, serve_argv
from sparkcluster.supervise.notify import post

INCIDENT = Incident("2026-12-01T21:00:00+00:00", "vLLM", Seen.ENGINE_DEAD, Action.RESTART, Outcome.RECOVERED,
                    4.1, 71.5, None, "engine-dead: restart (TP 2): answering again")


def test_an_incident_and_a_state_go_to_json_and_back_and_a_torn_line_is_skipped():
    line = json.dumps(INCIDENT.to_json())
    assert json.loads(line) == {"at": "2026-12-01T21:00:00+00:00", "target": "vLLM", "seen": "engine-dead",
                                "action": "restart", "outcome": "recovered", "detected_s": 4.1, "recovered_s": 71.5,
                                "root_cause": None, "text": "engine-dead: restart (TP 2): answering again",
                                "version": 1, "phases": None}
    assert parse_events(f"{line}\n{line}\n{line[:30]}") == [INCIDENT, INCIDENT]  # a power cut mid-write
    assert INCIDENT.line() == ("2026-12-01T21:00:00+00:00 vLLM: engine-dead: restart (TP 2): answering again "
                               "(detected in 4 s, answering again after 72 s)")
    state = SupervisorState(WatchState.GAVE_UP, "2026-12-01T21:00:00+00:00", 3, "3 restarts within the last hour")
    assert parse_state(json.dumps(state.to_json())) == state
    assert parse_state("{") is None and parse_state(None) is None


def test_the_head_repeats_the_serve_as_given_without_what_only_this_machine_means():
    own = ["serve", "-i", "inv.yml", "--tp", "2", "--json", "--notify", "http://hook/x", "--model", "m",
           "--inventory=other.yml", "--check", "--trust-new-host-keys", "--forks", "4"]
    assert serve_argv_for_head(own) == ("--tp", "2", "--model", "m")


def test_the_supervisors_serve_runs_as_asked_or_degraded_on_the_nodes_left(tmp_path: Path):
    spec = SupervisorSpec(("--tp", "2", "--model", "m", "--limit=spark-1,spark-2"), ("--max-model-len", "512"))
    full = serve_argv(spec, tmp_path / "inv.yml")
    assert full[1:] == ["-m", "sparkcluster", "serve", "-i", str(tmp_path / "inv.yml"), "--json", "--tp", "2",
                        "--model", "m", "--limit=spark-1,spark-2", "--", "--max-model-len", "512"]
    degraded = serve_argv(spec, tmp_path / "inv.yml", ["spark-1"], tp=1)
    assert degraded[7:] == ["--model", "m", "--limit", "spark-1", "--tp", "1", "--", "--max-model-len", "512"]


def test_the_root_cause_is_the_serves_own_error():
    said = ("inventory: x\n  vLLM loading\nerror: starting vLLM on spark-2 failed (exit 1): boom\n"
            "  fix: check python_env\n")
    assert first_error(said) == "starting vLLM on spark-2 failed (exit 1): boom fix: check python_env"
    assert first_error("") == "the serve failed and said nothing"


def test_the_unit_restarts_always_and_stopping_it_ends_a_serve_it_runs():
    unit = unit_text("spark", "/home/spark", ".local/share/sparkcluster/lib/abc")
    assert "Restart=always\n" in unit and "KillMode" not in unit and "WantedBy=multi-user.target" in unit
    assert "ExecStart=/usr/bin/python3 -m sparkcluster supervise run\n" in unit
    assert "EnvironmentFile=-/home/spark/.config/sparkcluster/supervisor/secrets.env\n" in unit
    assert "Environment=PYTHONPATH=/home/spark/.local/share/sparkcluster/lib/abc\n" in unit


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict]]]:
    got: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", got
    finally:
        server.shutdown()


def test_an_incident_is_posted_as_json_with_a_text_a_chat_webhook_shows(receiver):
    url, got = receiver
    assert post(url, INCIDENT)
    assert got[0]["seen"] == "engine-dead" and got[0]["recovered_s"] == 71.5
    assert got[0]["text"] == f"sparkcluster: {INCIDENT.line()}"


def test_a_receiver_that_is_not_there_costs_a_warning_not_the_supervisor():
    assert not post("http://127.0.0.1:9/hook", INCIDENT)


def test_the_key_in_the_units_environment_file_reads_back_unchanged_as_systemd_reads_it():
    """The simulator's systemd parses EnvironmentFile= as systemd does (quotes, backslash escapes inside double
    quotes): a key with a quote or a backslash reaches the probe unchanged (review of issue 48)."""
    import importlib.util
    from importlib.machinery import SourceFileLoader

    path = Path(__file__).parents[3] / "sparkcluster/sim/host/sim-systemd-runner"
    spec = importlib.util.spec_from_loader("runner", SourceFileLoader("runner", str(path)))
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    parse = runner.environment_file
    for key in ("sk-plain", 'sk-"quoted"', "sk-back\\slash", "sk-$dollar"):
        assert parse(environment_line("VLLM_API_KEY", key)) == {"VLLM_API_KEY": key}


def test_the_heads_inventory_reaches_the_nodes_with_the_heads_own_key_and_carries_flag_secrets_as_serve_env(tmp_path):
    from sparkcluster.engine.inventory import load_inventory
    from sparkcluster.serving.supervisor_unit import head_inventory_doc

    key = tmp_path / "control_key"
    key.write_text("not a key\n")
    path = tmp_path / "inventory.yml"
    path.write_text(f"name: pair\nvars:\n  user: spark\n  key: {key}\n  serve_env: {{A: '1'}}\n"
                    "  supervise: {interval_s: 5}\nhosts:\n  spark-1: {address: 10.0.0.1, role: head}\n"
                    "  spark-2: {address: 10.0.0.2, role: worker, vars: {serve_env: {B: '2'}}}\n")
    doc = head_inventory_doc(load_inventory(path, check_files=False), {"VLLM_API_KEY": "sk-flag"})
    assert doc["vars"]["key"] == "~/.ssh/id_ed25519"
    assert doc["vars"]["known_hosts"] == "~/.config/sparkcluster/supervisor/known_hosts"
    assert str(key) not in str(doc)  # the control machine's key never leaves it
    assert doc["vars"]["serve_env"] == {"A": "1", "VLLM_API_KEY": "sk-flag"}
    assert doc["vars"]["supervise"] == {"interval_s": 5}
    assert doc["hosts"]["spark-2"] == {"address": "10.0.0.2", "role": "worker", "port": 22, "user": "spark",
                                       "vars": {"serve_env": {"B": "2"}}}


def test_status_reads_the_supervisor_in_one_command_run_by_a_real_shell(tmp_path):
    """What `status` shows of the supervisor comes from one command on the head: run here by a real shell over a
    home holding its files (no unit: not installed, not active)."""
    import subprocess

    from sparkcluster.serving.supervisor_unit import parse_view, view_command

    folder = tmp_path / ".config/sparkcluster/supervisor"
    folder.mkdir(parents=True)
    state = SupervisorState(WatchState.DEGRADED, "2026-12-01T21:00:00+00:00", 1, "serving without spark-2")
    (folder / "state.json").write_text(json.dumps(state.to_json()))
    (folder / "events.jsonl").write_text("".join(json.dumps(INCIDENT.to_json()) + "\n" for _ in range(5)))
    ran = subprocess.run(["sh", "-c", view_command(last=3).script], cwd=tmp_path, capture_output=True, text=True,
                         env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    view = parse_view(ran.stdout)
    assert view is not None and not view.installed and not view.active
    assert view.state == state and view.incidents == (INCIDENT, INCIDENT, INCIDENT)
    assert parse_view("garbage") is None
