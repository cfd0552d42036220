"""The control plane each node advertises (Ray, gloo, VLLM_HOST_IP, the rendezvous), judged from the facts: an
address some node cannot reach, a Wi-Fi one or one its node does not hold is named."""

from __future__ import annotations

from dataclasses import replace

from sparkcluster.engine.facts import Interface
from sparkcluster.nccl import controlplane
from tests.support.nccl import node

NODES = ("spark-1", "spark-2", "spark-3")


def facts(wifi_on: str | None = None) -> dict:
    """Three nodes on the management LAN 192.168.1.0/24 (enP7s7), spark-1 and spark-2 also on one ring link."""
    out = {n: node(i, {0, 1}, {"enp1s0f1np1": f"10.0.2.{i}/24"} if n != "spark-3" else {})
           for i, n in enumerate(NODES, start=1)}
    if wifi_on:
        f = out[wifi_on]
        out[wifi_on] = replace(f, interfaces=(*f.interfaces, Interface("wlP9s9", "UP", 1500, ("192.168.8.23/24",))))
    return out


def env(ip: str, netdev: str = "enP7s7") -> dict[str, str]:
    return {"VLLM_HOST_IP": ip, "RAY_NODE_IP_ADDRESS": ip, "GLOO_SOCKET_IFNAME": netdev, "NCCL_SOCKET_IFNAME": netdev,
            "TP_SOCKET_IFNAME": netdev, "NCCL_IB_HCA": "rocep1s0f0"}


def judged(envs: dict[str, dict[str, str]], f: dict) -> list[controlplane.ControlAddress]:
    advertised = [a for n in NODES for a in controlplane.advertised(n, envs[n], f[n], "spark-1")]
    return controlplane.judge(advertised, f)


def test_the_management_lan_every_node_is_on_passes_and_is_listed():
    f = facts()
    out = judged({n: env(f"192.168.1.{10 + i}") for i, n in enumerate(NODES, start=1)}, f)
    assert [a.problem for a in out] == [""] * 15
    assert controlplane.grouped(out)[0] == ("spark-1 192.168.1.11 on enP7s7: VLLM_HOST_IP, RAY_NODE_IP_ADDRESS, "
                                            "GLOO_SOCKET_IFNAME=enP7s7, NCCL_SOCKET_IFNAME=enP7s7, TP_SOCKET_IFNAME=enP7s7")


def test_a_ring_links_address_reaches_one_neighbour_only():
    f = facts()
    envs = {n: env(f"192.168.1.{10 + i}") for i, n in enumerate(NODES, start=1)}
    envs["spark-2"] = env("10.0.2.2", "enp1s0f1np1")
    bad = [a for a in judged(envs, f) if a.problem]
    assert [str(a) for a in bad][:2] == [
        "spark-2 VLLM_HOST_IP 10.0.2.2 on enp1s0f1np1: spark-3 has no interface on 10.0.2.0/24 and no route to it "
        "that answers ping: it cannot reach it",
        "spark-2 RAY_NODE_IP_ADDRESS 10.0.2.2 on enp1s0f1np1: spark-3 has no interface on 10.0.2.0/24 and no route "
        "to it that answers ping: it cannot reach it"]
    assert "on a ring the node's routed address (scnode" in controlplane.fix(bad[0])
    assert "fabric.control_plane: lan, the management LAN (the inventory address)" in controlplane.fix(bad[0])


def test_wifi_an_address_not_held_and_a_rendezvous_off_the_head():
    f = facts(wifi_on="spark-3")
    envs = {n: env(f"192.168.1.{10 + i}") for i, n in enumerate(NODES, start=1)}
    envs["spark-3"] = {"VLLM_HOST_IP": "192.168.8.23", "GLOO_SOCKET_IFNAME": "wlP9s9"}
    envs["spark-2"] = {"VLLM_HOST_IP": "192.168.1.99", "MASTER_ADDR": "192.168.1.12"}
    problems = {(a.node, a.source): a.problem for a in judged(envs, f) if a.problem}
    assert problems[("spark-3", "VLLM_HOST_IP")].startswith("a Wi-Fi address (wlP9s9)")
    assert problems[("spark-3", "GLOO_SOCKET_IFNAME=wlP9s9")].startswith("a Wi-Fi address (wlP9s9)")
    assert problems[("spark-2", "VLLM_HOST_IP")] == "held by no interface of spark-2"
    # The rendezvous is the head's: spark-2's own address there is not one the head holds.
    assert problems[("spark-2", "rendezvous (MASTER_ADDR)")] == "held by no interface of spark-1"
    assert len(problems) == 4


def test_an_exclusion_list_and_a_name_are_read_as_such():
    f = facts()
    out = judged({"spark-1": {"NCCL_SOCKET_IFNAME": "^lo,docker0", "VLLM_HOST_IP": "spark-1.local"},
                  "spark-2": {}, "spark-3": {"GLOO_SOCKET_IFNAME": "enp1s0f1np1"}}, f)
    assert [(a.node, a.source, a.problem) for a in out] == [
        ("spark-1", "VLLM_HOST_IP", "not an IP address (a name resolves to whichever interface it was registered on)"),
        ("spark-3", "GLOO_SOCKET_IFNAME=enp1s0f1np1", "enp1s0f1np1 has no IPv4 address on spark-3")]
