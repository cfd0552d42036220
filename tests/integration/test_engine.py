"""The engine end to end on simulated Sparks: facts, the runner, one connection per host, check mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from sparkcluster.engine.events import StepFinished
from sparkcluster.engine.inventory import load_inventory
from sparkcluster.engine.locks import Busy, held
from sparkcluster.engine.playbook import load_playbook
from sparkcluster.engine.runner import Runner
from sparkcluster.engine.session import connect
from tests.support.helpers import SESSION_DRIVERS, run_cli as cli, ssh

pytestmark = pytest.mark.sim


def write(tmp_path: Path, name: str, doc: dict | str) -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def inventory_with(cluster, tmp_path: Path, **vars: object) -> Path:
    doc = yaml.safe_load(cluster.inventory_path.read_text())
    doc["vars"].update(vars)
    return write(tmp_path, "inventory.yml", doc)


def test_facts_shows_every_host_and_json_holds_the_same(cluster):
    text = cli("facts", str(cluster.inventory_path))
    assert text.returncode == 0, text.stderr
    doc = json.loads(cli("facts", "-i", str(cluster.inventory_path), "--json").stdout)
    assert list(doc) == ["spark-1", "spark-2", "spark-3"]
    for (name, facts), driver in zip(doc.items(), SESSION_DRIVERS):
        host = cluster.host(name)
        assert facts["gpus"][0] == {"name": "NVIDIA GB10", "driver_version": driver, "compute_cap": "12.1"}
        by_name = {i["name"]: i for i in facts["interfaces"]}
        assert by_name["enp1s0f1np1"]["ipv4"] == [f"{host.fabric_ips[0]}/24"] and by_name["enp1s0f1np1"]["mtu"] == 9000
        assert by_name["enP2p1s0f1np1"]["ipv4"] == [f"{host.fabric_ips[1]}/24"]
        assert {(d["hca"], d["up"]) for d in facts["rdma"]} == {
            ("rocep1s0f1", True), ("roceP2p1s0f1", True), ("rocep1s0f0", False), ("roceP2p1s0f0", False)}
        assert facts["docker"]["installed"] and facts["docker"]["daemon_up"]
        assert facts["hf_cache"] == "/home/spark/.cache/huggingface"
        # the table shows the same things a person looks for
        assert driver in text.stdout and host.fabric_ips[0] in text.stdout
    assert text.stdout.count("NVIDIA GB10") == 3 and "Down" in text.stdout and "/home/spark/.cache/huggingface" in text.stdout


PLAYBOOK = """
name: engine-test
plays:
  - name: write
    steps:
      - file.content:
          path: ~/engine/{{ host.name }}.txt
          content: "note={{ note }}\\n"
          mode: "0600"
      - command.run:
          cmd: "mkdir -p ~/engine && touch ~/engine/ran"
          creates: ~/engine/ran
  - name: fail on spark-2
    steps:
      - command.run:
          cmd: "if [ $(hostname) = spark-2 ]; then echo 'disk on fire' >&2; exit 7; fi"
          fix: "put the fire out"
"""


def _connections(cluster, name: str) -> int:
    """TCP connections sshd accepted from this machine, from sshd's own log (not the client's counter)."""
    runner_ip = str(cluster.topology.bridges[f"{cluster.topology.prefix}lan"].ip)
    log = (cluster.host_dir(cluster.host(name)) / "boot.log").read_text()
    return log.count(f"Connection from {runner_ip} ")


def test_run_reports_a_failure_with_command_exit_code_stderr_and_fix_and_uses_one_connection(cluster, tmp_path):
    note = "$(touch /tmp/pwned); `id`; echo hi > /tmp/pwned2"
    inv = inventory_with(cluster, tmp_path, note=note)
    pb = write(tmp_path, "pb.yml", PLAYBOOK)
    before = {h.name: _connections(cluster, h.name) for h in cluster.topology.hosts}
    out = cli("run", str(pb), "-i", str(inv), "--json")
    after = {h.name: _connections(cluster, h.name) for h in cluster.topology.hosts}
    try:
        assert out.returncode == 1, out.stderr
        doc = json.loads(out.stdout)
        failure = doc["failures"]["spark-2"]
        assert failure["command"].startswith("if [ $(hostname) = spark-2 ]")
        assert failure["exit_code"] == 7 and failure["stderr_tail"] == "disk on fire" and failure["fix"] == "put the fire out"
        assert doc["recap"]["spark-1"]["failed"] == 0 and doc["recap"]["spark-2"]["failed"] == 1
        assert {h: after[h] - before[h] for h in after} == {"spark-1": 1, "spark-2": 1, "spark-3": 1}
        # the inventory value reached the host as a literal string, never as shell
        assert ssh(cluster, "spark-1", "cat ~/engine/spark-1.txt").stdout == f"note={note}\n"
        assert ssh(cluster, "spark-1", "stat -c %a ~/engine/spark-1.txt").stdout == "600\n"
        assert ssh(cluster, "spark-1", "ls /tmp/pwned /tmp/pwned2 2>&1 || true").stdout.count("No such file") == 2
        # a second run changes nothing (the failing verb aside)
        second = json.loads(cli("run", str(pb), "-i", str(inv), "--json").stdout)
        assert [s["status"] for s in second["steps"] if s["play"] == "write"] == ["ok"] * 6
    finally:
        for h in cluster.topology.hosts:
            ssh(cluster, h.name, "rm -rf ~/engine")


def _disk_snapshot(cluster, name: str) -> dict[str, tuple[int, int]]:
    """Every path a host has written to its disk (its overlay upper layer), with size and mtime."""
    upper = cluster.host_dir(cluster.host(name)) / "upper"
    noise = {"var/log/wtmp", "var/log/lastlog", "var/log/btmp"}  # sshd's login accounting
    snap = {}
    for dirpath, _, files in os.walk(upper):
        for f in files:
            p = Path(dirpath) / f
            rel = str(p.relative_to(upper))
            if rel not in noise and not p.is_symlink():
                st = p.stat()
                snap[rel] = (st.st_size, st.st_mtime_ns)
    return snap


def test_check_mode_changes_nothing_on_any_host(cluster, tmp_path):
    inv = inventory_with(cluster, tmp_path, note="x")
    pb = write(tmp_path, "pb.yml", PLAYBOOK)
    before = {h.name: _disk_snapshot(cluster, h.name) for h in cluster.topology.hosts}
    out = cli("run", str(pb), "-i", str(inv), "--check", "--diff")
    assert out.returncode == 0, out.stdout + out.stderr  # nothing ran, so nothing failed
    assert "would create ~/engine/spark-1.txt" in out.stdout
    assert "+note=x" in out.stdout  # --diff shows the file that would be written
    after = {h.name: _disk_snapshot(cluster, h.name) for h in cluster.topology.hosts}
    assert before == after


def test_host_powered_off_before_the_run_is_unreachable_and_the_others_complete(cluster, fresh_host, tmp_path):
    cluster.power_off(fresh_host)
    inv = inventory_with(cluster, tmp_path, note="x")
    pb = write(tmp_path, "pb.yml", """
plays:
  - name: p
    steps:
      - command.run: {cmd: "true"}
""")
    out = cli("run", str(pb), "-i", str(inv))
    assert out.returncode == 1
    assert "unreachable" in out.stdout and fresh_host in out.stdout
    recap = out.stdout[out.stdout.index("RECAP"):].splitlines()
    assert f"{fresh_host} : ok=0  changed=0  skipped=0  failed=0  unreachable=1" in recap
    assert "spark-1 : ok=0  changed=1  skipped=0  failed=0  unreachable=0" in recap


def test_host_powered_off_during_a_run_is_unreachable(cluster, fresh_host, tmp_path):
    inventory = load_inventory(inventory_with(cluster, tmp_path, note="x"))
    pb = load_playbook(write(tmp_path, "pb.yml", """
plays:
  - name: slow
    steps:
      - command.run: {cmd: "sleep 3"}
      - command.run: {cmd: "true"}
"""))
    events: list = []
    timer = threading.Timer(1.5, cluster.power_off, [fresh_host])
    with connect(inventory) as session:
        runner = Runner(session, pb, events.append)
        timer.start()
        result = runner.run()
        timer.join()
    assert result.recap[fresh_host].unreachable == 1, result.failures
    assert result.recap["spark-1"].changed == 2 and result.recap["spark-2"].changed == 2
    assert result.exit_code == 1
    finished = [e for e in events if isinstance(e, StepFinished) and e.host == fresh_host]
    assert finished[-1].status == "unreachable" and "dropped off" in finished[-1].reason


HOLD_A_LOCK = """
import sys, time
from sparkcluster.engine.inventory import load_inventory
from sparkcluster.engine.locks import held
from sparkcluster.engine.session import connect
with connect(load_inventory(sys.argv[1])) as session, held(session, "test-lock", "a test run", "wait"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_node_lock_refuses_a_second_run_and_dies_with_the_run_that_held_it(cluster):
    """engine/locks.py, which `stage` (per model) and `serve`/`up` (per cluster) take: the second run is refused
    with the first one's PID, and a SIGKILLed holder leaves nothing behind to clean up."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_A_LOCK, str(cluster.inventory_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with connect(load_inventory(cluster.inventory_path)) as session:
            with pytest.raises(Busy) as refused:
                with held(session, "test-lock", "a test run", "wait"):
                    pytest.fail("two runs held one lock")
            assert refused.value.message.startswith("spark-1: a test run is already running there: ")
            assert f"(pid {holder.pid} on " in refused.value.message
            holder.send_signal(signal.SIGKILL)  # no cleanup at all: the lock goes with its SSH connection
            holder.wait()
            deadline = time.monotonic() + 15
            while True:
                try:
                    with held(session, "test-lock", "a test run", "wait"):
                        break
                except Busy:
                    assert time.monotonic() < deadline, "the lock outlived the run that held it"
                    time.sleep(0.5)
    finally:
        holder.kill()
