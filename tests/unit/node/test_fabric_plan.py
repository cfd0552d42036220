"""The fabric's addresses planned from a real Spark's facts (tests/fixtures/probe-spark.txt), as data: which twins
get which address, what is kept, what collides, and the netplan file."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Interface, IPv4Network
from pathlib import Path

import pytest
import yaml

from sparkcluster.node.addressing import (AddressPlan, FabricError, Twin, cabled_port, collisions, duplicates,
                                        fabric_config, managed_netdevs, netplan_yaml, plan_addresses)
from sparkcluster.engine.facts import HostFacts, parse_probe
from sparkcluster.engine.inventory import Host, Inventory

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def spark() -> HostFacts:
    return parse_probe((FIXTURES / "probe-spark.txt").read_text())


def fresh_from_the_box() -> HostFacts:
    """The same Spark before anyone configured its QSFP twins: no IPv4, MTU 1500."""
    facts = spark()
    return replace(facts, interfaces=tuple(replace(i, ipv4=(), mtu=1500) if i.name.startswith("en") and "np" in i.name
                                           else i for i in facts.interfaces))


def inventory(*names: str, fabric: dict | None = None, pins: dict[str, str] | None = None) -> Inventory:
    hosts = tuple(Host(n, f"10.0.0.{i}", "head" if i == 1 else "worker", fabric_ip=(pins or {}).get(n))
                  for i, n in enumerate(names, start=1))
    return Inventory(Path("inv.yml"), "t", hosts, {"fabric": fabric} if fabric else {})


def test_a_fresh_node_gets_one_address_per_twin_on_its_own_subnet():
    inv = inventory("spark-a", "spark-b")
    plan = plan_addresses(inv, inv.hosts[1], fresh_from_the_box(), fabric_config(inv, inv.hosts[1]))
    assert plan == AddressPlan(1, (
        Twin("enp1s0f1np1", IPv4Network("192.168.177.0/24"), IPv4Interface("192.168.177.12/24"), 1500, True, True),
        Twin("enP2p1s0f1np1", IPv4Network("192.168.178.0/24"), IPv4Interface("192.168.178.12/24"), 1500, True, True),
    ), 9000)
    assert [t.netdev for t in plan.to_assign] == ["enp1s0f1np1", "enP2p1s0f1np1"]


def test_addresses_a_user_set_are_kept_and_not_written_to_our_file():
    inv = inventory("spark-a", "spark-b")
    plan = plan_addresses(inv, inv.hosts[0], spark(), fabric_config(inv, inv.hosts[0]))
    assert plan.to_assign == () and plan.to_retune == ()
    assert [str(t.address) for t in plan.twins] == ["192.168.177.11/24", "192.168.178.11/24"]
    assert yaml.safe_load(netplan_yaml(plan))["network"]["ethernets"] == {}


def test_numbering_survives_limit_and_pins():
    inv = inventory("spark-a", "spark-b", "spark-c", "spark-d")
    limited = inv.limit(["spark-a", "spark-d"])
    plan = plan_addresses(limited, limited.hosts[1], fresh_from_the_box(), fabric_config(limited, limited.hosts[1]))
    assert str(plan.twins[0].address) == "192.168.177.14/24"  # still .14 with b and c left out
    pinned = inventory("spark-a", "spark-b", pins={"spark-b": "192.168.177.42"})
    plan = plan_addresses(pinned, pinned.hosts[1], fresh_from_the_box(), fabric_config(pinned, pinned.hosts[1]))
    assert [str(t.address) for t in plan.twins] == ["192.168.177.42/24", "192.168.178.42/24"]


def test_config_from_the_inventory_and_its_errors():
    inv = inventory("a", fabric={"subnets": ["10.9.0.0/24", "10.9.1.0/24"], "mtu": 9000, "confirm_timeout": 10})
    config = fabric_config(inv, inv.hosts[0])
    assert config.subnets == (IPv4Network("10.9.0.0/24"), IPv4Network("10.9.1.0/24")) and config.confirm_s == 10
    for bad, message in (({"subnets": ["10.9.0.0/24"]}, "two IPv4 networks"),
                         ({"subnets": ["10.9.0.0/16", "10.9.1.0/24"]}, "overlap"),
                         ({"subnets": ["10.9.0.1/24", "10.9.1.0/24"]}, "host bits set"),
                         ({"mtu": 100}, "1280 to 9216"), ({"mtus": 9000}, "unknown key 'mtus'")):
        with pytest.raises(FabricError, match=message):
            fabric_config(inventory("a", fabric=bad), inventory("a").hosts[0])


def test_no_link_and_two_links_are_errors_with_the_fix():
    down = replace(spark(), rdma=tuple(replace(d, up=False) for d in spark().rdma))
    with pytest.raises(FabricError, match="the cable is not connected") as e:
        cabled_port(down)
    assert "seat the QSFP cable" in e.value.fix
    both = replace(spark(), rdma=tuple(replace(d, up=True) for d in spark().rdma))
    with pytest.raises(FabricError, match="both QSFP ports have a link"):
        cabled_port(both)


def test_a_subnet_on_the_management_network_collides():
    inv = inventory("a", fabric={"subnets": ["192.168.1.0/24", "192.168.2.0/24"]})
    plan = plan_addresses(inv, inv.hosts[0], fresh_from_the_box(), fabric_config(inv, inv.hosts[0]))
    assert collisions(plan, fresh_from_the_box()) == [
        "the fabric subnet 192.168.1.0/24 for enp1s0f1np1 overlaps 192.168.1.0/24 on enP7s7"]


def test_the_same_address_on_two_nodes_is_named():
    inv = inventory("a", "b", pins={"b": "192.168.177.11"})
    plans = {h.name: plan_addresses(inv, h, fresh_from_the_box(), fabric_config(inv, h)) for h in inv.hosts}
    assert duplicates(plans) == ["192.168.177.11 is a's and b's", "192.168.178.11 is a's and b's"]


def test_the_netplan_file_round_trips():
    inv = inventory("a")
    plan = plan_addresses(inv, inv.hosts[0], fresh_from_the_box(), fabric_config(inv, inv.hosts[0]))
    text = netplan_yaml(plan)
    assert yaml.safe_load(text)["network"]["ethernets"]["enp1s0f1np1"] == {
        "dhcp4": False, "dhcp6": False, "link-local": [], "mtu": 9000, "addresses": ["192.168.177.11/24"]}
    assert managed_netdevs(text) == ("enp1s0f1np1", "enP2p1s0f1np1")
    assert managed_netdevs("not: [yaml") == () and managed_netdevs(None) == ()


def test_without_configured_subnets_the_fabric_keeps_the_ones_in_use():
    def on(a: str, b: str) -> HostFacts:
        facts = spark()
        moved = {"enp1s0f1np1": (a,), "enP2p1s0f1np1": (b,)}
        return replace(facts, interfaces=tuple(replace(i, ipv4=moved.get(i.name, i.ipv4)) for i in facts.interfaces))
    inv = inventory("spark-a", "spark-b", "spark-c")
    peers = [on("10.9.0.11/24", "10.9.1.11/24"), on("10.9.0.12/24", "10.9.1.12/24"), fresh_from_the_box()]
    config = fabric_config(inv, inv.hosts[2], peers)
    assert config.subnets == (IPv4Network("10.9.0.0/24"), IPv4Network("10.9.1.0/24"))
    plan = plan_addresses(inv, inv.hosts[2], fresh_from_the_box(), config)
    assert [str(t.address) for t in plan.to_assign] == ["10.9.0.13/24", "10.9.1.13/24"]
    assert fabric_config(inv, inv.hosts[2], [fresh_from_the_box()]).subnets == (
        IPv4Network("192.168.177.0/24"), IPv4Network("192.168.178.0/24"))


def nvidia_link_local(host_part: int) -> HostFacts:
    """NVIDIA's "Connect two Sparks" netplan state: each twin on 169.254.0.0/16, MTU 1500 (as owners' `ip addr`
    shows it)."""
    facts = spark()
    ll = {"enp1s0f1np1": (IPv4Interface(f"169.254.20.{host_part}/16"),),
          "enP2p1s0f1np1": (IPv4Interface(f"169.254.201.{host_part}/16"),)}
    return replace(facts, interfaces=tuple(replace(i, ipv4=ll[i.name], mtu=1500) if i.name in ll else i
                                           for i in facts.interfaces))


def test_link_local_twins_get_the_fabric_subnets_and_lose_the_link_local_addresses():
    inv = inventory("spark-a", "spark-b")
    peers = [nvidia_link_local(98), nvidia_link_local(68)]
    config = fabric_config(inv, inv.hosts[1], peers)
    assert config.subnets == (IPv4Network("192.168.177.0/24"), IPv4Network("192.168.178.0/24"))  # not 169.254/16
    plan = plan_addresses(inv, inv.hosts[1], peers[1], config)
    assert [(t.netdev, str(t.address), tuple(map(str, t.replaces))) for t in plan.to_assign] == [
        ("enp1s0f1np1", "192.168.177.12/24", ("169.254.20.68/16",)),
        ("enP2p1s0f1np1", "192.168.178.12/24", ("169.254.201.68/16",))]
    assert [t.netdev for t in plan.to_retune] == ["enp1s0f1np1", "enP2p1s0f1np1"]  # MTU 1500 -> 9000
    assert any("link-local" in n and "pin fabric.subnets" in n for n in plan.notes)


def test_link_local_kept_when_the_inventory_pins_it():
    inv = inventory("spark-a", "spark-b", pins={"spark-b": "169.254.20.68"},
                    fabric={"subnets": ["169.254.0.0/16", "10.8.1.0/24"]})
    facts = nvidia_link_local(68)
    plan = plan_addresses(inv, inv.hosts[1], facts, fabric_config(inv, inv.hosts[1], [facts]))
    assert [(str(t.address), t.assign, t.replaces) for t in plan.twins] == [
        ("169.254.20.68/16", False, ()), ("169.254.201.68/16", False, ())]
