"""Found by hand (issue 46): after `bootstrap --runtime host`, before a vLLM environment exists (no `python_env` in the
inventory), status, logs, top and doctor --bundle all exited 2 with "the host runtime needs `python_env`". Only what
starts an engine needs one: these build their runtime without it and watch, read and stop the node's processes;
serve and up still refuse before connecting, naming the node and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.doctor import bundle
from sparkcluster.engine import session as session_module
from sparkcluster.engine.errors import UsageError
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.node.network import comm_env_path
from sparkcluster.serving.runtime import HostRuntime, NodeEnv, RuntimeChoice
from sparkcluster.serving.status import ProcessState, logs_command, status
from sparkcluster.serving.top import alive_checks
from tests.support.strict_transport import StrictTransport

HEAD = Host("spark-1", "10.0.0.1", role="head")  # runtime host, no python_env: as bootstrap --runtime host leaves it
WORKER = Host("spark-2", "10.0.0.2", role="worker")
HOST = RuntimeChoice("host")
NO_ENV = "the host runtime needs `python_env`"


def test_watching_reading_and_stopping_need_no_python_env():
    runtime = HOST.on(HEAD)
    assert runtime == HostRuntime(None, caches=True)
    assert "serve/main.pid" in runtime.alive("main").script
    assert "serve/vllm.log" in runtime.logs("vllm", 5, False).script
    assert "for r in router vllm main" in runtime.stop_all().script
    # top's per-node probe, logs' command (every role of an `up` or nothing recorded)
    assert set(alive_checks(HOST, HEAD, ["main", "vllm"])) == {"main", "vllm"}
    assert "tail -n 100" in logs_command(None, HOST, HEAD, HEAD, 100, False).script


def test_what_enters_the_serving_env_still_names_the_missing_python_env():
    runtime = HOST.on(HEAD)
    for starts in (lambda: runtime.start_main(["ray", "start"], NodeEnv("c.env")),
                   lambda: runtime.run_in_env(["python3", "-c", "1"], NodeEnv("c.env"))):
        with pytest.raises(UsageError, match=f"spark-1: {re.escape(NO_ENV)}") as raised:
            starts()
        assert "python_env: /path/to/venv" in raised.value.fix
    with pytest.raises(UsageError, match=f"spark-2: {re.escape(NO_ENV)}"):
        HOST.check_starts(WORKER)
    RuntimeChoice("docker").check_starts(WORKER)  # the docker runtime needs no python_env


def answering(host: Host) -> StrictTransport:
    """A node that was bootstrapped (its comm env) and serves nothing: every process check answers `not running`."""
    transport = StrictTransport(host.name).put_file(comm_env_path(host).removeprefix("~/"), "VLLM_HOST_IP=10.1.0.1\n")
    return transport.expect(re.compile(r"\.pid|du -sk|last-verify|verify|sparkcluster-supervisor"), exit_code=1,
                            times=None)


def test_status_reads_every_node_of_the_host_runtime_without_python_env():
    inventory = Inventory(Path("inv.yml"), "lab", (HEAD, WORKER), {"runtime": "host"})
    session = Session(inventory, {h.name: answering(h) for h in (HEAD, WORKER)})
    state = status(session, HOST)  # failed before: UsageError from RuntimeChoice.on
    assert state.error is None
    assert {n: s.processes for n, s in state.nodes.items()} == {
        "spark-1": {"main": ProcessState.STOPPED}, "spark-2": {"main": ProcessState.STOPPED}}


def test_doctor_bundle_collects_the_logs_of_the_host_runtime_without_python_env():
    inventory = Inventory(Path("inv.yml"), "lab", (HEAD,), {"runtime": "host"})
    transport = StrictTransport("spark-1").expect(re.compile("."), stdout="", times=None)
    got = bundle._collect(Session(inventory, {"spark-1": transport}), HEAD, HEAD, HOST, None)
    assert "logs.txt" in got and any("serve/main.log" in line for line in transport.lines())


@pytest.mark.parametrize("command", [["up"], ["serve", "--model", "Qwen/Qwen3-0.6B", "--tp", "1"]])
def test_what_starts_an_engine_still_refuses_before_connecting(tmp_path, monkeypatch, capsys, command):
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected although the input was refused")
    monkeypatch.setattr(session_module, "Transport", refuse)
    path = tmp_path / "inv.yml"
    path.write_text("vars: {runtime: host}\nhosts:\n  spark-1: {address: 192.168.1.50, role: head}\n")
    assert cli.main([*command, "-i", str(path)]) == 2
    assert f"spark-1: {NO_ENV}" in " ".join(capsys.readouterr().err.split())


def test_status_and_logs_go_on_to_connect(tmp_path, monkeypatch, capsys):
    """Failed before: exit 2 before connecting. Now they connect (here: a node refused at once, exit 1)."""
    connected: list[str] = []

    def refuse(host: Host, **kwargs: object) -> None:
        connected.append(host.name)
        raise AssertionError("stop here: it connected")
    monkeypatch.setattr(session_module, "Transport", refuse)
    path = tmp_path / "inv.yml"
    path.write_text("vars: {runtime: host}\nhosts:\n  spark-1: {address: 192.168.1.50, role: head}\n")
    for command in ("status", "logs"):
        with pytest.raises(AssertionError, match="it connected"):
            cli.main([command, "-i", str(path)])
    assert connected == ["spark-1", "spark-1"] and NO_ENV not in capsys.readouterr().err
