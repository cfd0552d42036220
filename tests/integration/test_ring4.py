"""A 4-ring of simulated Sparks from unaddressed cables (`sim up 4 --topology ring --no-fabric-addresses`), one
cluster for the file: `topology` finds every cable by discovery before anything changes, bootstrap gives each cable
its own subnets (a second run changes nothing), neighbours answer over each link, the comm env is the 4-ring's
(ring algorithm forced); then eugr's 4x-spark-cluster recipe, by file, renders and serves the tiny Llama with the
real CPU vLLM as TP 2 x PP 2, ranks along the ring, a completion answering. The diagonal crosses its neighbour
over the fabric (only that neighbour forwards, per twin, also under Docker's DROP policy), a management-LAN host
routed through a node reaches no cable subnet, and `control_plane: lan` puts forwarding back as bootstrap found it.
Also: a 3-ring cabled port 0 to port 0 is refused before any change, naming the re-cabling (its own small cluster,
no vLLM)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from sparkcluster.serving.readiness import http
from tests.support.helpers import run_cli, ssh
from tests.support.ring_cluster import TestEveryRing, ring_fixture  # noqa: F401 (TestEveryRing: collected here)
from tests.support.rings import (
    bootstrap,
    eugr_clone,
    forwarded,
    forwarding_state,
    ipv4,
    lan_host_reaches,
    node_address,
    node_logs,
    ready_to_serve,
    ring,
    topology,
    vllm_lines,
)
from tests.support.sim_serving import processes

pytestmark = [pytest.mark.sim, pytest.mark.slow]


ring_cluster = ring_fixture(4, "ring4")  # the cluster block both ring files share


def test_the_diagonal_crosses_a_neighbour_over_the_fabric_and_the_lan_reaches_no_cable_subnet(ring_cluster):
    """Round 5's S4 on the 4-ring: spark-2 forwards spark-1 <-> spark-3 (and spark-1 spark-2 <-> spark-4) between
    its two control-plane twins alone, rp_filter strict there; ssh and ping cross it over the fabric, also where
    Docker set FORWARD's policy to DROP. spark-3's LAN port, standing for any management-LAN host, routes the
    spark-1 <-> spark-2 cable's subnet through spark-1's LAN address: unanswered, nothing forwarded; and with
    spark-1's management port forwarding (as Docker's ip_forward=1 leaves every interface) still unanswered: the
    chain drops both pings."""
    c = ring_cluster.bootstrapped
    values = forwarding_state(c, "spark-2")
    assert (values["enp1s0f0np0/rp_filter"], values["enp1s0f1np1/rp_filter"]) == ("1", "1")
    chain = ssh(c, "spark-2", "sudo iptables -w -S FORWARD").stdout.splitlines()
    assert chain[1] == "-A FORWARD -j SPARKCLUSTER-FABRIC", chain
    far, ssh_far = node_address(c, "spark-3"), ("ssh -o BatchMode=yes -o StrictHostKeyChecking=no "
                                               "-o UserKnownHostsFile=/dev/null -o ConnectTimeout=5")
    ssh(c, "spark-2", "sudo iptables -w -P FORWARD DROP")
    try:
        before = forwarded(c, "spark-2")
        assert ssh(c, "spark-1", f"ping -c 2 -W 2 -q {far} >/dev/null && {ssh_far} {far} hostname",
                   check=False).stdout.strip() == "spark-3"
        assert forwarded(c, "spark-2") - before >= 4  # it went through spark-2, over the cables
    finally:
        ssh(c, "spark-2", "sudo iptables -w -P FORWARD ACCEPT")
    spark2 = ipv4(c, "spark-2")["enp1s0f0np0"]  # its end of the cable from spark-1's port 1, twin 0
    assert lan_host_reaches(c, "spark-3", "spark-1", spark2) == (False, 0)
    # The kernel counts a datagram in ForwDatagrams once routed to be forwarded, before netfilter's FORWARD hook:
    # here the chain's DROP counters tell that the chain stopped it.
    ssh(c, "spark-1", "sudo sysctl -qw net.ipv4.conf.enP7s7.forwarding=1; sudo iptables -w -Z SPARKCLUSTER-FABRIC")
    try:
        assert not lan_host_reaches(c, "spark-3", "spark-1", spark2)[0]
        listing = ssh(c, "spark-1", "sudo iptables -w -L SPARKCLUSTER-FABRIC -v -x -n").stdout.splitlines()
        assert sum(int(w[0]) for w in map(str.split, listing) if w[2:3] == ["DROP"]) == 2, listing
    finally:
        ssh(c, "spark-1", "sudo sysctl -qw net.ipv4.conf.enP7s7.forwarding=0")


def test_eugrs_4x_recipe_serves_tp2_x_pp2_along_the_ring(ring_cluster, tmp_path):
    c = ring_cluster.bootstrapped
    ready_to_serve(c)
    user = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    recipe = eugr_clone(tmp_path / "cache", tmp_path / "config") / "recipes" / "4x-spark-cluster" / "tiny-llama.yaml"

    def serve(*more: str) -> subprocess.CompletedProcess:
        return run_cli("serve", "-i", str(c.inventory_path), "--runtime", "host", "--launcher", "native",
                       "--no-verify", "--recipe", str(recipe), *more, env=user)

    check = serve("--check")
    assert check.returncode == 0, check.stderr
    assert "would serve local/tiny-llama (host, native)" in check.stdout, check.stdout
    assert check.stdout.count("--tensor-parallel-size 2 --pipeline-parallel-size 2") == 4, check.stdout
    result = serve("--ready-timeout", "400", "--json")
    try:
        assert result.returncode == 0, result.stderr[-2000:] + node_logs(c)
        head = c.host("spark-1").mgmt_ip
        code, text = http(f"http://{head}:8000/v1/completions",
                          {"model": "tiny-4x", "prompt": "Four nodes of", "max_tokens": 8, "temperature": 0},
                          timeout=60)
        assert code == 200 and json.loads(text)["usage"]["completion_tokens"] == 8, text
        # One rank per node, placed along the ring walked from the head (1-2-3-4): stage 0 is spark-1, spark-2;
        # stage 1 is spark-4, spark-3, so that each rank's peer in the other stage is cabled to it (1-4, 2-3),
        # never the missing diagonal. The mod ran on every node first.
        for rank, line in zip((0, 1, 3, 2), vllm_lines(c)):
            assert "--tensor-parallel-size 2" in line and "--pipeline-parallel-size 2" in line, line
            assert f"--node-rank {rank} " in line and "--nnodes 4" in line, line
        for host in c.topology.hosts:
            assert ssh(c, host.name, "cat ~/eugr-mod-ran").stdout.strip() == "stage ready"
    finally:
        down = run_cli("down", "-i", str(c.inventory_path), "--json", env=user)
    assert down.returncode == 0, down.stderr
    assert all("vllm serve" not in processes(c, h.name) for h in c.topology.hosts)


def test_choosing_the_lan_puts_forwarding_back_as_bootstrap_found_it(ring_cluster, tmp_path):
    """`fabric.control_plane: lan` on the routed 4-ring (after the serve: the plane is not needed again): on every
    node ip_forward and each interface's forwarding and rp_filter are as before the first bootstrap, the chain and
    the values kept for this are gone, and the LAN still reaches no cable subnet."""
    c, found = ring_cluster.bootstrapped, ring_cluster.found
    doc = yaml.safe_load(c.inventory_path.read_text())
    doc["vars"].setdefault("fabric", {})["control_plane"] = "lan"
    lan = tmp_path / "lan.yml"
    lan.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = run_cli("bootstrap", str(lan), "--runtime", "host", env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "forwarding put back as it was found" in " ".join(done.stdout.split())
    for host in c.topology.hosts:
        assert forwarding_state(c, host.name) == found[host.name], host.name
        left = ssh(c, host.name, "sudo iptables -w -S; sudo ls /var/lib/sparkcluster/fabric "
                                 "/etc/sysctl.d").stdout
        assert "SPARKCLUSTER" not in left and "sysctl-found" not in left and "sparkcluster-fabric" not in left, left
    assert lan_host_reaches(c, "spark-3", "spark-1", ipv4(c, "spark-2")["enp1s0f0np0"]) == (False, 0)


def test_a_ring_cabled_port_0_to_port_0_is_refused_before_any_change(tmp_path):
    c = ring(3, "ring00", miscable="port0-port0", vllm=False)
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


def test_a_node_cabled_to_itself_is_refused_and_named_before_any_change(tmp_path):
    """README audit round 3, item 3: `--miscable self` on a 3-ring passed `topology` unnamed. The head names the node:
    its own port answering it (`is cabled to itself`), or, with no address to answer from, the one node silent on
    both ports (`looks cabled to itself`)."""
    c = ring(3, "ringself", miscable="self", vllm=False)
    try:
        code, _ = topology(c)
        assert code == 1
        out = bootstrap(c, tmp_path)
        said = " ".join(out.stdout.split())
        assert out.returncode == 1 and re.search(r"spark-3 (is|looks) cabled to itself", said), said
        assert all(ipv4(c, h.name) == {} for h in c.topology.hosts)  # nothing was addressed
    finally:
        c.down()
