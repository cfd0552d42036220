"""`sparkcluster monitor` on a simulated 3-node cluster with the distribution's real Prometheus on the head: `up`
starts every node's exporter and Prometheus, a second `up` changes nothing, every node's target is up; a GPU at
95 C throttled by hw_thermal_slowdown on spark-2 (`sim hardware`) fires the GPU alerts naming spark-2, a planted
Xid in its kernel log the Xid alert, and `sim power-off spark-3` the node-down alert naming spark-3, each within two
minutes; `down` stops everything and keeps Prometheus' data.

The faults go on two nodes at once, so the four alerts' `for:` minutes run side by side (~80 s), not one after the
other (~155 s): a node powered off stops its exporter, so the GPU alerts and the node-down one need a node each."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from sparkcluster.monitor.deploy import DEFAULT_LISTEN, PROMETHEUS_DIR
from sparkcluster.sim import SimCluster, UpOptions
from tests.support.helpers import require_sim, run_cli, ssh, unique_name

pytestmark = [pytest.mark.sim]
XID_79 = "NVRM: Xid (PCI:000f:01:00): 79, pid=2113, name=python3, GPU has fallen off the bus."
ALERT_WITHIN_S = 120


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    require_sim(docker=False)
    c = SimCluster.up(UpOptions(count=3, name=unique_name("monitor"), docker=False))
    try:
        yield c
    finally:
        c.down()


def monitor(cluster: SimCluster, *args: str) -> tuple[int, dict]:
    result = run_cli("monitor", *args, "-i", str(cluster.inventory_path), "--json", timeout=600)
    assert result.stdout, result.stderr[-2000:]
    return result.returncode, json.loads(result.stdout)


def firing(cluster: SimCluster) -> list[dict]:
    script = ("python3 -c 'import urllib.request; print(urllib.request.urlopen("
              f"\"http://{DEFAULT_LISTEN}/api/v1/alerts\", timeout=10).read().decode())'")
    alerts = json.loads(ssh(cluster, "spark-1", script).stdout)["data"]["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


def wait_for(cluster: SimCluster, expected: dict[str, str], since: float) -> dict[str, float]:
    """When each alert fired (seconds after `since`), naming its node (`expected`: alert name -> node) in its labels
    and its summary."""
    seen: dict[str, float] = {}
    while time.monotonic() - since < ALERT_WITHIN_S + 30:
        for alert in firing(cluster):
            name = alert["labels"]["alertname"]
            node = expected.get(name)
            if node is not None and name not in seen and alert["labels"].get("node") == node:
                assert node in alert["annotations"]["summary"], alert
                seen[name] = time.monotonic() - since
        if set(seen) == set(expected):
            return seen
        time.sleep(3)
    raise AssertionError(f"fired: {seen}, of {sorted(expected)}")


def sim_cli(cluster: SimCluster, *args: str) -> None:
    result = run_cli("sim", *args, "--name", cluster.state.name, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_monitor_up_alerts_and_down(sim: SimCluster) -> None:
    code, first = monitor(sim, "up")
    assert code == 0, first
    assert {(o["place"], o["piece"], o["status"]) for o in first["outcomes"]} == {
        ("spark-1", "exporter", "changed"), ("spark-2", "exporter", "changed"), ("spark-3", "exporter", "changed"),
        ("spark-1", "prometheus", "changed")}
    code, again = monitor(sim, "up")
    assert code == 0 and {o["status"] for o in again["outcomes"]} == {"ok"}, again

    deadline = time.monotonic() + 60
    while True:
        code, status = monitor(sim, "status")
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert code == 0 and status["healthy"], status
    up = {(t["job"], t["node"]) for t in status["targets"] if t["health"] == "up"}
    assert up == {("sparkcluster-node", "spark-1"), ("sparkcluster-node", "spark-2"), ("sparkcluster-node", "spark-3"),
                  ("sparkcluster-supervisor", "spark-1")}, status

    started = time.monotonic()
    sim_cli(sim, "hardware", "spark-2", "--gpu-temp", "95", "--throttle", "hw_thermal_slowdown", "--kernel-log", XID_79)
    sim_cli(sim, "power-off", "spark-3")
    fired = wait_for(sim, {"SparkGpuHot": "spark-2", "SparkGpuThrottled": "spark-2", "SparkGpuXid": "spark-2",
                           "SparkNodeDown": "spark-3"}, started)
    assert max(fired.values()) <= ALERT_WITHIN_S, fired
    print(f"alerts fired after: {fired}")  # the measured times, in the test's output
    assert not [a for a in firing(sim) if a["labels"].get("node") == "spark-1"]  # the healthy node stays silent
    # the hot node answers its scrapes: the node-down alert is the powered-off node's alone
    assert [a["labels"].get("node") for a in firing(sim) if a["labels"]["alertname"] == "SparkNodeDown"] == ["spark-3"]

    code, stopped = monitor(sim, "down", "--limit", "spark-1")  # spark-3 is off
    assert code == 0 and "data kept" in stopped["outcomes"][0]["reason"], stopped
    assert ssh(sim, "spark-1", f"test -d {PROMETHEUS_DIR}/data && echo kept").stdout.strip() == "kept"
    assert ssh(sim, "spark-1", f"test -e {PROMETHEUS_DIR}/prometheus.pid || echo gone").stdout.strip() == "gone"
