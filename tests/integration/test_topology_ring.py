"""Rings from unaddressed cables on simulated Sparks (`sim up 3|4 --topology ring --no-fabric-addresses`):
`topology` finds every cable by discovery before anything changes, bootstrap gives each cable its own subnets
(a second run changes nothing), every node reaches its neighbours over each link, the comm env is the ring's;
a ring cabled port 0 to port 0 is refused before any change, naming the re-cabling. No Docker."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from sparkcluster.sim import SimCluster, UpOptions
from tests.helpers import require_sim, run_cli, ssh, unique_name

pytestmark = [pytest.mark.sim, pytest.mark.slow]
COMM_ENV = "/home/spark/.config/sparkcluster/comm.env"


def ring(count: int, tag: str, miscable: str = "") -> SimCluster:
    require_sim(docker=False)
    return SimCluster.up(UpOptions(count=count, name=unique_name(tag), docker=False, fabric_addresses=False,
                                   topology="ring", miscable=miscable))


def bootstrap(c: SimCluster, cfg: Path) -> subprocess.CompletedProcess:
    return run_cli("bootstrap", str(c.inventory_path), "--runtime", "host", env={"XDG_CONFIG_HOME": str(cfg)})


def topology(c: SimCluster) -> tuple[int, dict]:
    out = run_cli("topology", "-i", str(c.inventory_path), "--json")
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


def cables(doc: dict) -> set[tuple[str, int, str, int]]:
    return {(l["a"]["node"], l["a"]["port"], l["b"]["node"], l["b"]["port"]) for l in doc["links"]}


def ipv4(c: SimCluster, host: str) -> dict[str, str]:
    links = json.loads(c.exec_in(host, ["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout)
    return {l["ifname"]: f"{a['local']}/{a['prefixlen']}" for l in links for a in l["addr_info"]
            if l["ifname"].startswith("en") and "np" in l["ifname"]}


@pytest.fixture(scope="module", params=[3, 4], ids=["3-ring", "4-ring"])
def bootstrapped(request, tmp_path_factory):
    c = ring(request.param, f"ring{request.param}")
    try:
        code, before = topology(c)  # unaddressed: discovery runs on IPv6 link-local alone
        first = bootstrap(c, tmp_path_factory.mktemp("cfg"))
        yield c, before, code, first, tmp_path_factory
    finally:
        c.down()


def test_topology_finds_every_cable_before_anything_is_addressed(bootstrapped):
    c, before, code, _, _ = bootstrapped
    n = len(c.topology.hosts)
    assert code == 0 and before["kind"] == "ring" and before["problems"] == []
    crosswise = {("spark-1", 1, "spark-2", 0), *{(f"spark-{i}", 1, f"spark-{i + 1}", 0) for i in range(2, n)},
                 ("spark-1", 0, f"spark-{n}", 1)}
    assert cables(before) == crosswise
    assert len(before["links"]) == 2 * n and all(l["subnet"] is None for l in before["links"])
    assert {l["a"]["netdev"][:4] for l in before["links"]} == {"enp1", "enP2"}  # both twins of every cable


def test_bootstrap_gives_each_cable_its_own_subnets_then_changes_nothing(bootstrapped):
    c, _, _, first, tmp = bootstrapped
    assert first.returncode == 0, first.stdout + first.stderr
    addresses = {h.name: ipv4(c, h.name) for h in c.topology.hosts}
    # Each node has four addresses on four subnets; each subnet holds exactly the two ends of one cable.
    subnets: dict[str, set[str]] = {}
    for host, twins in addresses.items():
        assert len(twins) == 4 and len({a.rsplit(".", 1)[0] for a in twins.values()}) == 4
        for address in twins.values():
            subnets.setdefault(address.rsplit(".", 1)[0], set()).add(host)
    assert len(subnets) == 2 * len(c.topology.hosts) and all(len(ends) == 2 for ends in subnets.values())
    second = bootstrap(c, tmp.mktemp("cfg"))
    assert second.returncode == 0 and set(re.findall(r"changed=(\d+)", second.stdout)) == {"0"}, second.stdout
    code, after = topology(c)
    assert code == 0 and all(l["subnet"] for l in after["links"])


def test_neighbours_answer_over_each_link_and_the_comm_env_is_the_rings(bootstrapped):
    c, _, _, first, _ = bootstrapped
    assert "preflight.fabric" in first.stdout
    env = dict(line.split("=", 1) for line in ssh(c, "spark-2", f"cat {COMM_ENV}").stdout.splitlines()
               if "=" in line and not line.startswith("#"))
    assert len(env["NCCL_IB_HCA"].split(",")) == 4 and env["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"
    assert env["VLLM_HOST_IP"] == c.host("spark-2").mgmt_ip and env["NCCL_SOCKET_IFNAME"] == "enP7s7"
    if len(c.topology.hosts) == 4:
        assert env["NCCL_ALGO"] == "Ring" and env["NCCL_SKIP_TREE_CONNECT"] == "1"
    # spark-1's port 1 is cabled to spark-2's port 0: their addresses on that cable answer each other.
    peer = ipv4(c, "spark-2")["enp1s0f0np0"].split("/")[0]
    assert ssh(c, "spark-1", f"ping -c 1 -W 2 -I enp1s0f1np1 {peer}").returncode == 0


def test_a_ring_cabled_port_0_to_port_0_is_refused_before_any_change(tmp_path):
    c = ring(3, "ring00", miscable="port0-port0")
    try:
        code, doc = topology(c)
        assert code == 1 and doc["kind"] == "ring"
        out = bootstrap(c, tmp_path)
        assert out.returncode == 1
        assert "spark-1 port 0 to spark-2 port 0" in out.stdout
        assert "on spark-1, swap the two QSFP cables (port 0 <-> port 1)" in out.stdout
        assert all(ipv4(c, h.name) == {} for h in c.topology.hosts)  # nothing was addressed
    finally:
        c.down()
