"""A ring's routed control plane as data: each node's address and its routes to every other node's (through a
neighbour where no cable joins them), the netplan file that keeps them (accepted by the real `netplan generate`),
the live change and its rollback, what the kernel's route table must show, and the verdict on an address some node
cannot reach."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from ipaddress import IPv4Interface, IPv4Network
from pathlib import Path

import pytest
import yaml

from sparkcluster.engine.facts import HostFacts
from sparkcluster.engine.inventory import Inventory
from sparkcluster.nccl.controlplane import ControlAddress, judge, reach_command, to_reach
from sparkcluster.node import forwarding
from sparkcluster.node.addressing import (
    AddressPlan,
    FabricError,
    check_node_subnet,
    fabric_config,
    managed_netdevs,
    netplan_yaml,
)
from sparkcluster.node.planned import planned_facts
from sparkcluster.node.routed import missing_routes, parse_routes, paths
from sparkcluster.node.steps.addresses import FabricAddresses, Leftover, NodeNow
from tests.support.fabric import NODES3, NODES4, RING3, RING4, cabled, ring_plans


def routes(plan: AddressPlan) -> list[str]:
    assert plan.node is not None
    return [r.ip_args() for r in plan.node.routes]


def test_on_a_3_ring_every_node_is_a_neighbour():
    _, _, plans = ring_plans(NODES3, RING3)
    assert {n: str(p.node.address) for n, p in plans.items() if p.node} == {
        "spark-1": "10.177.0.11/32", "spark-2": "10.177.0.12/32", "spark-3": "10.177.0.13/32"}
    # Cable 0 (spark-1 port 0 - spark-3 port 1) is on .177/.178, cable 1 (spark-1 port 1 - spark-2 port 0) on
    # .179/.180, cable 2 (spark-2 port 1 - spark-3 port 0) on .181/.182; each route rides twin 0 of its cable.
    assert routes(plans["spark-1"]) == ["10.177.0.12 via 192.168.179.12 dev enp1s0f1np1 src 10.177.0.11",
                                        "10.177.0.13 via 192.168.177.13 dev enp1s0f0np0 src 10.177.0.11"]
    assert routes(plans["spark-2"]) == ["10.177.0.11 via 192.168.179.11 dev enp1s0f0np0 src 10.177.0.12",
                                        "10.177.0.13 via 192.168.181.13 dev enp1s0f1np1 src 10.177.0.12"]
    assert routes(plans["spark-3"]) == ["10.177.0.11 via 192.168.177.11 dev enp1s0f1np1 src 10.177.0.13",
                                        "10.177.0.12 via 192.168.181.12 dev enp1s0f0np0 src 10.177.0.13"]


def test_on_a_4_ring_the_diagonal_goes_through_one_neighbour_both_ways():
    _, _, plans = ring_plans(NODES4, RING4)
    # Cables: 0 spark-1 p0 - spark-4 p1 (.177), 1 spark-1 p1 - spark-2 p0 (.179), 2 spark-2 p1 - spark-3 p0
    # (.181), 3 spark-3 p1 - spark-4 p0 (.183). spark-1 <-> spark-3 crosses spark-2 both ways; spark-2 <-> spark-4
    # crosses spark-1 both ways: a request and its answer take one path.
    assert routes(plans["spark-1"]) == ["10.177.0.12 via 192.168.179.12 dev enp1s0f1np1 src 10.177.0.11",
                                        "10.177.0.13 via 192.168.179.12 dev enp1s0f1np1 src 10.177.0.11",
                                        "10.177.0.14 via 192.168.177.14 dev enp1s0f0np0 src 10.177.0.11"]
    assert routes(plans["spark-3"])[0] == "10.177.0.11 via 192.168.181.12 dev enp1s0f0np0 src 10.177.0.13"
    assert routes(plans["spark-2"])[2] == "10.177.0.14 via 192.168.179.11 dev enp1s0f0np0 src 10.177.0.12"
    assert routes(plans["spark-4"])[1] == "10.177.0.12 via 192.168.177.11 dev enp1s0f1np1 src 10.177.0.14"
    walks = paths(NODES4, {"spark-1": ("spark-2", "spark-4"), "spark-2": ("spark-1", "spark-3"),
                           "spark-3": ("spark-2", "spark-4"), "spark-4": ("spark-1", "spark-3")})
    assert walks[("spark-1", "spark-3")] == ("spark-1", "spark-2", "spark-3")
    assert walks[("spark-3", "spark-1")] == ("spark-3", "spark-2", "spark-1")


def test_the_netplan_file_holds_the_bridge_and_the_routes_and_netplan_accepts_it(tmp_path: Path):
    _, _, plans = ring_plans(NODES4, RING4)
    text = netplan_yaml(plans["spark-1"])
    network = yaml.safe_load(text)["network"]
    assert network["bridges"] == {"scnode": {"dhcp4": False, "dhcp6": False, "link-local": [],
                                             "addresses": ["10.177.0.11/32"]}}
    assert network["ethernets"]["enp1s0f1np1"]["routes"] == [
        {"to": "10.177.0.12/32", "via": "192.168.179.12", "from": "10.177.0.11"},
        {"to": "10.177.0.13/32", "via": "192.168.179.12", "from": "10.177.0.11"}]
    assert managed_netdevs(text) == ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1")
    # A twin the user addressed gets an entry with the routes alone, which is not ours to manage.
    assert managed_netdevs("network: {ethernets: {enp1s0f0np0: {routes: []}}}") == ()
    if shutil.which("netplan") is None:
        pytest.skip("netplan is not installed here")
    (tmp_path / "etc/netplan").mkdir(parents=True)
    (tmp_path / "etc/netplan/40-sparkcluster-fabric.yaml").write_text(text)
    (tmp_path / "etc/netplan/40-sparkcluster-fabric.yaml").chmod(0o600)
    subprocess.run(["netplan", "generate", "--root-dir", str(tmp_path)], check=True, capture_output=True)
    generated = tmp_path / "run/systemd/network"
    assert "Kind=bridge" in (generated / "10-netplan-scnode.netdev").read_text()
    network_file = (generated / "10-netplan-enp1s0f1np1.network").read_text()
    assert "Destination=10.177.0.13/32" in network_file and "Gateway=192.168.179.12" in network_file


def test_the_change_adds_address_routes_and_forwarding_after_the_twins_and_the_rollback_undoes_them():
    inv, facts, plans = ring_plans(NODES4, RING4)
    plan = plans["spark-1"]
    assert plan.node is not None
    fresh = NodeNow(False, False, {}, plan.node.routes)
    # spark-1 is the 4-ring's corner whose walk spark-2 <-> spark-4 crosses: it forwards that, per twin
    found = forwarding.Now({"net.ipv4.conf.enp1s0f0np0.forwarding": "0", "net.ipv4.conf.enp1s0f1np1.forwarding": "0"},
                           "", {}, None, False)
    want = forwarding.wanted(plan.node, [t.netdev for t in plan.twins])

    class Ctx:
        host = inv.hosts[0]

        def run(self, command):  # the SSH session arrives on the management port
            from sparkcluster.engine.transport import Result
            return Result(command, 0, "enP7s7\n", "", 0.0)

    (command,) = FabricAddresses(None)._commands(Ctx(), plan, "", fabric_config(inv, inv.hosts[0]), fresh,  # type: ignore[arg-type]
                                                 forwards=(want, found))
    script = command.display()
    live = script.index("ip addr add 192.168.179.11/24 dev enp1s0f1np1")
    for line in ("ip link add scnode type bridge", "ip addr replace 10.177.0.11/32 dev scnode",
                 "ip route replace 10.177.0.13 via 192.168.179.12 dev enp1s0f1np1 src 10.177.0.11",
                 "sysctl -qw net.ipv4.conf.enp1s0f0np0.forwarding=1"):
        assert script.index(line) > live, line  # a route's next hop is on a subnet the twin holds by then
    assert "ip_forward" not in script
    for line in ("ip link del scnode", "ip route del 10.177.0.13/32", "sysctl -qew net.ipv4.conf.enp1s0f0np0.forwarding=0",
                 "previous-sysctl.conf /etc/sysctl.d/60-sparkcluster-fabric.conf; else rm -f "
                 "/etc/sysctl.d/60-sparkcluster-fabric.conf"):
        assert line in script, line
    # What --check hands the later steps: the node address on its bridge.
    bridge = planned_facts(facts["spark-1"], plan).interface("scnode")
    assert bridge is not None and bridge.ipv4 == (IPv4Interface("10.177.0.11/32"),)


def test_lan_chosen_on_a_routed_ring_retires_the_bridge_routes_and_sysctl_file_and_the_rollback_restores_them():
    inv, _, plans = ring_plans(NODES3, RING3, {"control_plane": "lan"})
    plan = replace(plans["spark-1"], node=None)  # as fabric.addresses plans it under `lan`
    routes = "10.177.0.12 via 192.168.179.12 dev enp1s0f1np1 src 10.177.0.11\n"
    table = "192.168.1.0/24 dev enP7s7 proto kernel scope link src 192.168.1.11\n" + routes
    leftover = Leftover((IPv4Interface("10.177.0.11/32"),), tuple(f"{to} {rest}" for to, rest in
                                                                   parse_routes(table).items() if "10.177.0.11" in rest),
)
    legacy = "# Written by `sparkcluster bootstrap`\nnet.ipv4.ip_forward = 1\n"  # what earlier versions wrote
    found = forwarding.Now({"net.ipv4.ip_forward": "1"}, legacy, {}, None, False)
    assert leftover.routes == (routes.strip(),)  # the management LAN's own route is none of ours

    class Ctx:
        host = inv.hosts[0]

        def run(self, command):  # the SSH session arrives on the management port
            from sparkcluster.engine.transport import Result
            return Result(command, 0, "enP7s7\n", "", 0.0)

    (command,) = FabricAddresses(None)._commands(Ctx(), plan, "", fabric_config(inv, inv.hosts[0]),  # type: ignore[arg-type]
                                                 None, leftover, (forwarding.Wanted(), found))
    script = command.display()
    assert script.index("ip route del 10.177.0.12") < script.index("ip link del scnode")
    assert "rm -f /etc/sysctl.d/60-sparkcluster-fabric.conf\n" in script and "ip_forward=" not in script
    for line in ("ip addr replace 10.177.0.11/32 dev scnode", f"ip route replace {routes.strip()} 2>/dev/null",
                 "previous-sysctl.conf /etc/sysctl.d/60-sparkcluster-fabric.conf"):
        assert line in script.split("rollback.sh")[0], line  # in the rollback script, written before the change


def test_the_kernel_routes_converge_or_are_named_missing():
    _, _, plans = ring_plans(NODES4, RING4)
    node = plans["spark-1"].node
    assert node is not None
    table = ("default via 10.0.0.1 dev enP7s7\n192.168.1.0/24 dev enP7s7 proto kernel scope link src 192.168.1.11\n"
             "10.177.0.12 via 192.168.179.12 dev enp1s0f1np1 src 10.177.0.11\n"
             "10.177.0.13 via 192.168.179.12 dev enp1s0f1np1 src 10.177.0.11 metric 5\n"
             "10.177.0.14 via 192.168.179.12 dev enp1s0f1np1 src 10.177.0.11\n")  # .14 the long way round
    assert [str(r.to) for r in missing_routes(node, parse_routes(table))] == ["10.177.0.14"]
    assert NodeNow(True, True, {}, ()).converged
    assert not NodeNow(True, False, {}, ()).converged  # the bridge without the node address


def test_the_node_subnet_is_checked_against_the_links_and_the_choice_of_control_plane():
    inv, _, _ = ring_plans(NODES4, RING4, {"node_subnet": "192.168.184.0/24"})  # cable 3's twin 1 on a 4-ring
    with pytest.raises(FabricError, match="overlaps the link subnet 192.168.184.0/24"):
        check_node_subnet(inv, fabric_config(inv, inv.hosts[0]))
    # A pair's or a switch's links may sit on the default node subnet: it holds nothing there.
    pair = Inventory(Path("inv.yml"), "t", inv.hosts[:2], {"fabric": {"subnets": ["10.177.0.0/24", "10.177.1.0/24"]}})
    assert fabric_config(pair, pair.hosts[0]).subnets[0] == IPv4Network("10.177.0.0/24")
    with pytest.raises(FabricError, match="fabric.node_subnet 10.177.0.0/24 overlaps the link subnet 10.177.0.0/24"):
        check_node_subnet(pair, fabric_config(pair, pair.hosts[0]))
    with pytest.raises(FabricError, match="control_plane must be routed or lan"):
        ring_plans(NODES3, RING3, {"control_plane": "wifi"})
    inv, _, _ = ring_plans(NODES3, RING3, {"control_plane": "lan", "node_subnet": "10.50.0.0/24"})
    assert fabric_config(inv, inv.hosts[0]).control_plane == "lan"


def routed_facts() -> dict[str, HostFacts]:
    from dataclasses import replace

    from sparkcluster.engine.facts import Interface
    facts, _ = cabled(RING3, NODES3)
    return {n: replace(f, interfaces=(*f.interfaces, Interface("scnode", "UNKNOWN", 1500, (f"10.177.0.{10 + i}/32",))))
            for i, (n, f) in enumerate(facts.items(), 1)}


def test_a_routed_address_counts_as_reached_only_where_the_node_pinged_it():
    facts = routed_facts()
    advertised = [ControlAddress("spark-3", "VLLM_HOST_IP", "10.177.0.13", "spark-3")]
    assert to_reach(advertised, facts) == {"spark-1": ["10.177.0.13"], "spark-2": ["10.177.0.13"]}
    assert "ping -c 1 -W 2 -q 10.177.0.13" in reach_command(["10.177.0.13"]).display()
    (ok,) = judge(advertised, facts, {"spark-1": ["10.177.0.13"], "spark-2": ["10.177.0.13"]})
    assert ok.problem == "" and ok.interface == "scnode"
    (bad,) = judge(advertised, facts, {"spark-1": ["10.177.0.13"]})  # spark-2's route to it is gone
    assert bad.problem == ("spark-2 has no interface on 10.177.0.13/32 and no route to it that answers ping: it "
                           "cannot reach it")
