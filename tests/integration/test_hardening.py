"""Issue 15 on the simulated cluster, where the behaviour crosses the network: host keys, the node a failure is
blamed on, staging's leftovers and a full disk."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sparkcluster.sim import SimCluster, UpOptions
from sparkcluster.sim.fakemodel import generate
from tests.helpers import require_sim, run_cli, ssh, unique_name

pytestmark = pytest.mark.sim

MODEL = "acme/fake-64m"
HUB = "/home/spark/.cache/huggingface/hub"


@pytest.fixture(scope="module")
def pair() -> Iterator[SimCluster]:
    require_sim(docker=False)
    c = SimCluster.up(UpOptions(count=2, name=unique_name("harden"), docker=False))
    try:
        generate(c, "spark-1", MODEL, 64 << 20, shards=2)
        yield c
    finally:
        c.down()


def head_only(cluster: SimCluster, tmp_path: Path, known_hosts: Path) -> Path:
    doc = yaml.safe_load(cluster.inventory_path.read_text())
    doc["vars"]["known_hosts"] = str(known_hosts)
    doc["hosts"] = {"spark-1": doc["hosts"]["spark-1"]}
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump(doc))
    return inv


def other_key(tmp_path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    return " ".join((tmp_path / "other.pub").read_text().split()[:2])


# ---- 8. host keys --------------------------------------------------------------------------------------
def test_trusted_new_keys_go_to_the_inventorys_known_hosts(pair, tmp_path):
    # Failed before: the key went to ~/.ssh/known_hosts, and the inventory's file stayed empty.
    home, known = tmp_path / "home", tmp_path / "known_hosts"
    home.mkdir()
    known.write_text("")
    inv = head_only(pair, tmp_path, known)
    trusted = run_cli("facts", str(inv), "--trust-new-host-keys", env={"HOME": str(home)})
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    assert known.read_text().startswith(pair.host("spark-1").mgmt_ip + " ssh-ed25519 ")
    assert not (home / ".ssh" / "known_hosts").exists()
    assert run_cli("facts", str(inv), env={"HOME": str(home)}).returncode == 0  # known now, no flag needed


@pytest.mark.parametrize("stale_in", ["inventory", "home"])
def test_a_changed_key_names_the_file_that_holds_the_old_one(pair, tmp_path, stale_in):
    # Failed before: the fix said `ssh-keygen -R ADDR`, which edits only ~/.ssh/known_hosts.
    home, known = tmp_path / "home", tmp_path / "known_hosts"
    (home / ".ssh").mkdir(parents=True)
    address = pair.host("spark-1").mgmt_ip
    stale = home / ".ssh" / "known_hosts" if stale_in == "home" else known
    known.write_text("")
    entry = f"{address} {other_key(tmp_path)}\n"
    stale.write_text(entry)
    out = run_cli("facts", str(head_only(pair, tmp_path, known)), "--trust-new-host-keys", env={"HOME": str(home),
                                                                                                 "COLUMNS": "1000"})
    assert out.returncode == 1 and "has CHANGED" in out.stdout
    assert f"ssh-keygen -R {address} -f {stale}" in out.stdout, out.stdout
    assert stale.read_text() == entry and known.read_text() == (entry if stale == known else "")  # never trusted


# ---- 4. a full disk is named as one, on the node that is full ------------------------------------------
@pytest.fixture
def small_disk(pair: SimCluster) -> Iterator[str]:
    """spark-2's HF cache on a 16 MB disk of its own; the 64 MB model cannot fit."""
    ssh(pair, "spark-2", f"mkdir -p {HUB} && mount -t tmpfs -o size=16m,mode=1777 hfhub {HUB}", user="root")
    try:
        yield "spark-2"
    finally:
        ssh(pair, "spark-2", f"umount {HUB}; rm -f /usr/local/bin/df", user="root")


def stage_json(cluster: SimCluster) -> tuple[int, dict]:
    out = run_cli("stage", MODEL, "--json", "-i", str(cluster.inventory_path))
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


def test_a_model_that_cannot_fit_is_refused_before_copying(pair, small_disk):
    # Failed before: the copy ran until the disk was full, then blamed ssh between spark-1 and spark-2.
    code, doc = stage_json(pair)
    node = doc["nodes"][small_disk]
    assert code == 1 and node["state"] == "failed" and node["bytes"] == 0
    assert node["error"].startswith(f"no space left on {small_disk} (needs 67 MB, has 17 MB)"), node["error"]
    assert f"free space on {small_disk}" in node["fix"] and "ssh" not in node["fix"]


def test_a_disk_that_fills_during_the_copy_is_named_too(pair, small_disk):
    # df on spark-2 claims room (as a disk filled by something else meanwhile would), so the copy starts and
    # rsync meets ENOSPC. Failed before: "check that spark-1 reaches ... by ssh".
    ssh(pair, small_disk, "printf '#!/bin/sh\\necho Filesystem 1024-blocks Used Available Capacity Mounted\\n"
                          "echo hfhub 99999999 0 99999999 0%% /\\n' > /usr/local/bin/df && chmod +x /usr/local/bin/df",
        user="root")
    code, doc = stage_json(pair)
    node = doc["nodes"][small_disk]
    assert code == 1 and node["state"] == "failed"
    assert node["error"].startswith(f"no space left on {small_disk} (needs "), node["error"]
    assert "ssh" not in node["fix"]


# ---- 4. the node a failure is blamed on ----------------------------------------------------------------
DIES_BETWEEN_PLAYS = """
plays:
  - name: before
    hosts: all
    steps:
      - command.run: {cmd: "true"}
  - name: the worker dies
    hosts: spark-2
    gather_facts: false
    steps:
      # sshd is the simulated host's PID 1: stopping it powers the host off, a second after this step returns.
      - command.run: {cmd: "sudo -n sh -c 'sleep 1; kill -TERM 1' >/dev/null 2>&1 </dev/null & true"}
  - name: the head sets up the mesh
    hosts: head
    gather_facts: false
    steps:
      - command.run: {cmd: "sleep 3"}
      - ssh.mesh: {}
"""


def test_a_worker_that_dies_between_plays_is_blamed_not_the_head(tmp_path):
    require_sim(docker=False)
    c = SimCluster.up(UpOptions(count=2, name=unique_name("blame"), docker=False))
    try:
        book = tmp_path / "pb.yml"
        book.write_text(DIES_BETWEEN_PLAYS)
        result = run_cli("run", str(book), "-i", str(c.inventory_path), "--json")
        doc = json.loads(result.stdout)
        assert result.returncode == 1, result.stdout + result.stderr
        assert set(doc["failures"]) == {"spark-2"}, doc["failures"]
        assert doc["recap"]["spark-2"]["unreachable"] == 1 and doc["recap"]["spark-1"]["failed"] == 0
        mesh = [s for s in doc["steps"] if s["host"] == "spark-1" and s["step"] == "ssh.mesh"]
        assert [s["status"] for s in mesh] in (["ok"], ["changed"]), mesh
        assert "sshd" not in json.dumps(doc["failures"])
    finally:
        c.down()
