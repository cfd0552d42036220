"""`sparkcluster sim` as a user runs it: a real process, real exit codes, JSON output."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import require_sim, ssh, unique_name

pytestmark = pytest.mark.sim


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "sparkcluster", *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"sparkcluster {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def test_bad_input_fails_with_exit_2_before_anything_is_created():
    name = unique_name("bad")
    for args, message in (
        (["--driver", "latest"], "invalid driver version"),
        (["--port0", "spark-7"], "spark-7"),
        (["--lan-rate", "fast"], "invalid LAN rate"),
        (["--driver", "580.95.05", "590.44"], "one per host"),
    ):
        result = cli("sim", "up", "3", "--name", name, *args, check=False)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
        assert "Traceback" not in result.stderr
    assert name not in cli("sim", "list", "--json").stdout


def test_missing_cluster_is_a_clear_error():
    result = cli("sim", "down", "no-such-cluster", check=False)
    assert result.returncode == 2
    assert "no simulated cluster named 'no-such-cluster'" in result.stderr


def test_up_two_clusters_side_by_side_with_port0_and_json():
    require_sim(docker=False)
    a, b = unique_name("cli-a"), unique_name("cli-b")
    try:
        doc_a = json.loads(cli("sim", "up", "2", "--name", a, "--no-docker", "--port0", "spark-2", "--json").stdout)
        doc_b = json.loads(cli("sim", "up", "1", "--name", b, "--no-docker", "--json").stdout)
        assert doc_a["subnets"]["lan"] != doc_b["subnets"]["lan"]  # chosen under a lock, never shared
        assert [h["cabled_port"] for h in doc_a["hosts"]] == [1, 0]
        assert doc_a["status"] == "up" and all(h["running"] for h in doc_a["hosts"])

        inventory = yaml.safe_load(Path(doc_a["inventory"]).read_text())
        assert inventory["hosts"]["spark-1"] == {"address": doc_a["hosts"][0]["mgmt_ip"], "role": "head"}
        assert inventory["hosts"]["spark-2"]["role"] == "worker"
        assert Path(inventory["vars"]["key"]).is_file() and Path(inventory["vars"]["known_hosts"]).is_file()

        from sparkcluster.sim import SimCluster
        cluster = SimCluster.load(a)
        assert ssh(cluster, "spark-2", "ibdev2netdev | grep Up").stdout == (
            "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Up)\nrocep1s0f0 port 1 ==> enp1s0f0np0 (Up)\n")
        # a wrong-port host still reaches its peer: the cable joins port 1 of spark-1 to port 0 of spark-2
        assert ssh(cluster, "spark-1", f"ping -c1 -W2 {doc_a['hosts'][1]['fabric_ips'][0]}").returncode == 0

        assert cli("sim", "power-off", "spark-2", "--name", a).stdout.strip() == "spark-2: powered off"
        listed = {c["name"]: c for c in json.loads(cli("sim", "list", "--json").stdout)}
        assert listed[a]["status"] == "degraded"
        assert cli("sim", "exec", "spark-1", "--name", a, "--", "hostname").stdout == "spark-1\n"
        assert cli("sim", "ssh", "spark-1", "--name", a, "--", "echo", "hi").stdout == "hi\n"

        clash = cli("sim", "up", "1", "--name", a, "--no-docker", check=False)
        assert clash.returncode == 2 and "already exists" in clash.stderr
    finally:
        cli("sim", "down", a, check=False)
        cli("sim", "down", b, check=False)
    names = [c["name"] for c in json.loads(cli("sim", "list", "--json").stdout)]
    assert a not in names and b not in names


def test_non_root_gets_told_to_use_root(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("runs the CLI as an unprivileged user, which needs root to arrange")
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "sparkcluster",
         "sim", "up", "1"], capture_output=True, text=True, cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert result.returncode == 2, result.stderr
    assert "needs root" in result.stderr
