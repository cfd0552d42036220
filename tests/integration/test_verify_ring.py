"""`sparkcluster verify` on a simulated 3-node ring, cabled crosswise and bootstrapped from the sim's addresses: the
whole collective on the control plane, then each of the ring's six twin links alone (a matrix of busbw), and the
control-plane addresses every node advertises. A link held down by `sim degrade` is named; an address some node
cannot reach is refused. One cluster (no Docker) serves the module."""

from __future__ import annotations

import json

import pytest

from sparkcluster.sim import SimCluster, UpOptions
from tests.helpers import require_sim, run_cli, ssh, unique_name

pytestmark = [pytest.mark.sim, pytest.mark.slow]
COMM_ENV = "~/.config/sparkcluster/comm.env"


@pytest.fixture(scope="module")
def ring3(tmp_path_factory):
    pytest.importorskip("torch")
    require_sim(docker=False)
    c = SimCluster.up(UpOptions(count=3, name=unique_name("vring"), docker=False, ssh_mesh=False, topology="ring"))
    try:
        out = run_cli("bootstrap", str(c.inventory_path), "--runtime", "host",
                      env={"XDG_CONFIG_HOME": str(tmp_path_factory.mktemp("cfg"))})
        assert out.returncode == 0, out.stdout + out.stderr
        yield c
    finally:
        c.down()


def verify(c: SimCluster, *args: str) -> tuple[int, dict, str]:
    out = run_cli("verify", str(c.inventory_path), "--json", *args)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout), out.stderr


def cables(doc: dict) -> set[tuple[str, int]]:
    return {(link["cable"], link["twin"]) for link in doc["links"]}


RING_CABLES = {"spark-1 port 0 <-> spark-3 port 1", "spark-1 port 1 <-> spark-2 port 0",
               "spark-2 port 1 <-> spark-3 port 0"}


def test_verify_passes_on_the_ring_with_a_matrix_of_its_links_and_the_control_plane(ring3):
    code, doc, _ = verify(ring3)
    assert code == 0 and doc["verdict"]["status"] == "PASS", doc["verdict"]
    assert doc["topology"] == "ring"
    assert cables(doc) == {(c, t) for c in RING_CABLES for t in (0, 1)}
    assert all(link["busbw_gbps"] > 0 and not link["error"] for link in doc["links"])
    # Each link's two ranks were bound to the twins at its ends, on that link's own subnet.
    for link in doc["links"]:
        a, b = link["a"], link["b"]
        assert {a["port"], b["port"]} == {0, 1} and a["netdev"][:3] == b["netdev"][:3]  # crosswise, one twin
        assert link["ips"][0].rsplit(".", 1)[0] == link["ips"][1].rsplit(".", 1)[0]
    # The control plane every node advertises, each on the management LAN every node reaches.
    advertised = {(a["node"], a["source"]): a for a in doc["control_plane"]}
    for node in ("spark-1", "spark-2", "spark-3"):
        vllm = advertised[(node, "VLLM_HOST_IP")]
        assert vllm["address"] == ring3.host(node).mgmt_ip and vllm["interface"] == "enP7s7" and not vllm["problem"]
        assert (node, "GLOO_SOCKET_IFNAME=enP7s7") in advertised
    text = run_cli("verify", str(ring3.inventory_path), "--no-links").stdout
    assert "control plane (the addresses each node advertises):" in text and "links of the" not in text


def test_a_degraded_link_of_the_ring_is_named(ring3):
    """spark-2's port 1, twin 0 (enp1s0f1np1) held to 50 Mbit/s: the whole collective runs on the control plane
    and cannot see it; its link's own run does."""
    netdev = ring3.degrade("spark-2", "enp1s0f1np1", "50mbit")
    try:
        code, doc, _ = verify(ring3)
        assert code == 1 and doc["verdict"]["status"] == "FAIL"
        slow = next(link for link in doc["links"] if link["cable"] == "spark-2 port 1 <-> spark-3 port 0"
                    and link["twin"] == 0)
        assert doc["verdict"]["cause"].startswith(
            f"link spark-2 port 1 <-> spark-3 port 0 twin 0 ({netdev}) is degraded: {slow['busbw_gbps']:.3f} GB/s alone")
        assert "spark-2 enp1s0f1np1, spark-3 enp1s0f0np0" in doc["verdict"]["fix"]
        others = [link["busbw_gbps"] for link in doc["links"] if link is not slow]
        assert len(others) == 5 and min(others) > 2 * slow["busbw_gbps"]
    finally:
        ring3.degrade("spark-2", netdev, None)


def test_a_control_plane_address_one_node_cannot_reach_fails_naming_it(ring3):
    """spark-3 advertises its address on the link to spark-1: spark-2 has no interface on that subnet."""
    link_ip = next(a for a in ssh(ring3, "spark-3", "ip -4 -o addr show enp1s0f1np1").stdout.split()
                   if a.count(".") == 3 and "/" in a).split("/")[0]
    ssh(ring3, "spark-3", f"sed -i.bak 's/^VLLM_HOST_IP=.*/VLLM_HOST_IP={link_ip}/' {COMM_ENV}")
    try:
        code, doc, _ = verify(ring3, "--no-links")
        assert code == 1 and doc["verdict"]["status"] == "FAIL"
        assert doc["verdict"]["cause"].startswith(
            f"spark-3 advertises a control-plane address some node cannot use: spark-3 VLLM_HOST_IP {link_ip} on "
            "enp1s0f1np1: spark-2 has no interface on ")
        assert "management LAN" in doc["verdict"]["fix"]
        bad = [a for a in doc["control_plane"] if a["problem"]]
        assert [(a["node"], a["source"]) for a in bad] == [("spark-3", "VLLM_HOST_IP")]
    finally:
        ssh(ring3, "spark-3", f"mv {COMM_ENV}.bak {COMM_ENV}")
