"""The fabric as a graph, built from facts and what answered on each twin: a pair, a switch, a 3-ring and a
4-ring are one value, and each cabling mistake is named with its fix. The wires are described as data here (which
twin ends share a wire), the answers derived from them as the link-layer probe would see them."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Network
from pathlib import Path

from sparkcluster.engine.facts import HostFacts
from sparkcluster.node.discovery import ipv4_candidates, probe_command
from sparkcluster.node.discovery import parse_probe as parse_answers
from sparkcluster.node.fabric import SWITCH, End, Fabric, Kind, build_fabric, cabling_problems
from tests.support.fabric import NODES3, NODES4, RING3, RING4, TWINS, cabled, node


def graph(nodes: list[str], cables: list[tuple[str, int, str, int]], **kw: object) -> Fabric:
    facts, answers = cabled(cables, nodes, **kw)  # type: ignore[arg-type]
    return build_fabric(nodes, facts, answers)


def test_a_pair_is_two_twin_links_on_one_cable():
    fabric = graph(["spark-1", "spark-2"], [("spark-1", 1, "spark-2", 1)])
    assert fabric.kind is Kind.PAIR
    assert [(l.a, l.b) for l in fabric.links] == [
        (End("spark-1", 1, "enp1s0f1np1"), End("spark-2", 1, "enp1s0f1np1")),
        (End("spark-1", 1, "enP2p1s0f1np1"), End("spark-2", 1, "enP2p1s0f1np1"))]
    assert [l.speed_mbps for l in fabric.links] == [200000, 200000]
    assert fabric.cables() == ((("spark-1", 1), ("spark-2", 1)),)
    # A pair keeps the two subnets it has always had: twin 0 on the first, twin 1 on the second.
    assert [fabric.segment(l.a) for l in fabric.links] == [0, 1]
    assert cabling_problems(fabric) == []


def test_a_switch_is_every_node_linked_to_it_per_twin():
    nodes = [f"spark-{i}" for i in range(1, 9)]
    fabric = graph(nodes, [], switch_ports={n: 1 for n in nodes}, strangers=1)
    assert fabric.kind is Kind.SWITCH
    assert len(fabric.links) == 16 and {l.b.node for l in fabric.links} == {SWITCH}
    assert {fabric.segment(l.a) for l in fabric.links if l.a.twin == 1} == {1}
    assert cabling_problems(fabric, "switch") == []
    # Two nodes on a switch that answers (a bridge, the operator's machine) are still a switch, not a pair.
    assert graph(nodes[:2], [], switch_ports={n: 1 for n in nodes[:2]}, strangers=1).kind is Kind.SWITCH


def test_a_3_ring_cabled_crosswise():
    fabric = graph(NODES3, RING3)
    assert fabric.kind is Kind.RING
    assert len(fabric.links) == 6 and fabric.ring_order() == ("spark-1", "spark-2", "spark-3")
    assert fabric.adjacency()["spark-2"] == ("spark-1", "spark-3")
    # Each cable its own pair of subnets: 3 cables, 6 segments, both twins of every node on one of its own.
    segments = {(e.node, e.netdev): fabric.segment(e) for l in fabric.links for e in (l.a, l.b)}
    assert sorted(set(segments.values())) == [0, 1, 2, 3, 4, 5]
    assert len({s for (n, _), s in segments.items() if n == "spark-1"}) == 4
    assert cabling_problems(fabric, "ring") == []
    doc = fabric.to_json()
    assert doc["kind"] == "ring" and len(doc["links"]) == 6
    assert doc["links"][0]["a"] == {"node": "spark-1", "port": 0, "netdev": "enp1s0f0np0"}
    assert doc["links"][0]["b"] == {"node": "spark-3", "port": 1, "netdev": "enp1s0f1np1"}


def test_a_4_ring_cabled_crosswise():
    fabric = graph(NODES4, RING4)
    assert fabric.kind is Kind.RING and len(fabric.links) == 8 and len(fabric.cables()) == 4
    assert fabric.ring_order() == ("spark-1", "spark-2", "spark-3", "spark-4")
    assert "spark-3" not in fabric.adjacency()["spark-1"]  # no diagonal
    assert cabling_problems(fabric) == []


def test_a_ring_cabled_port_0_to_port_0_names_the_swap():
    cables = [("spark-1", 0, "spark-2", 0), ("spark-2", 1, "spark-3", 0), ("spark-3", 1, "spark-1", 1)]
    fabric = graph(NODES3, cables)
    assert fabric.kind is Kind.RING
    problems = cabling_problems(fabric)
    assert len(problems) == 1
    assert "spark-1 port 0 to spark-2 port 0" in problems[0].what and "ibv_modify_qp" in problems[0].what
    assert problems[0].fix.startswith("on spark-1, swap the two QSFP cables")
    # The fix works: swapping spark-1's cables leaves a ring with no problem.
    fixed = [("spark-1", 1, "spark-2", 0), ("spark-2", 1, "spark-3", 0), ("spark-3", 1, "spark-1", 0)]
    assert cabling_problems(graph(NODES3, fixed)) == []


def test_a_node_cabled_to_itself():
    fabric = graph(["spark-1", "spark-2"], [("spark-2", 0, "spark-2", 1)])
    problems = cabling_problems(fabric)
    assert any("spark-2 is cabled to itself" in p.what for p in problems)


def test_some_direct_and_some_through_a_switch():
    fabric = graph(NODES3, [("spark-1", 0, "spark-2", 0)], switch_ports={n: 1 for n in NODES3})
    assert fabric.kind is Kind.MIXED
    (problem,) = cabling_problems(fabric)
    assert "spark-1-spark-2" in problem.what and "through a switch" in problem.what


def test_a_4_ring_with_a_missing_link_names_the_cable_to_add():
    fabric = graph(NODES4, RING4[:3])
    assert fabric.kind is Kind.OTHER
    (problem,) = cabling_problems(fabric, "ring")
    assert "the ring is open" in problem.what
    assert problem.fix.startswith("cable spark-1 port 0 to spark-4 port 1")


def test_a_cable_in_the_port_the_inventory_pins_away():
    fabric = graph(["spark-1", "spark-2"], [("spark-1", 0, "spark-2", 0)])
    (problem,) = cabling_problems(fabric, "auto", {"spark-2": ["enp1s0f1np1"]})
    assert "spark-2: the inventory pins enp1s0f1np1 (port 1), but the cable is in port 0" in problem.what


def test_the_inventory_saying_another_topology():
    (problem,) = cabling_problems(graph(NODES3, RING3), "switch")
    assert "fabric.topology: switch" in problem.what and "topology: ring" in problem.fix


def test_a_twin_nobody_answers_on_is_silent_not_a_link():
    facts, answers = cabled([("spark-1", 1, "spark-2", 1)], ["spark-1", "spark-2"])
    answers["spark-1"]["enP2p1s0f1np1"] = ()
    answers["spark-2"]["enP2p1s0f1np1"] = ()
    fabric = build_fabric(["spark-1", "spark-2"], facts, answers)
    assert len(fabric.links) == 1 and End("spark-1", 1, "enP2p1s0f1np1") in fabric.silent


def test_the_probe_command_and_its_answers():
    facts = {"spark-1": node(1, {1}, {"enp1s0f1np1": "10.0.0.11/24"}),
             "spark-2": node(2, {1}, {"enp1s0f1np1": "10.0.0.12/24"})}
    candidates = ipv4_candidates("spark-1", facts)
    assert candidates == {"enp1s0f1np1": ("10.0.0.12",), "enP2p1s0f1np1": ()}
    text = probe_command(("enp1s0f1np1", "enP2p1s0f1np1"), candidates).display()
    assert "ff02::1%enp1s0f1np1" in text and "-I enp1s0f1np1 10.0.0.12" in text
    answers = parse_answers("enp1s0f1np1 fe80::2:10%enp1s0f1np1: 10.0.0.12:\nenP2p1s0f1np1\n")
    assert answers == {"enp1s0f1np1": ("fe80::2:10", "10.0.0.12"), "enP2p1s0f1np1": ()}
    fabric = build_fabric(["spark-1", "spark-2"], facts, {"spark-1": answers, "spark-2": {}})
    assert fabric.links[0].b == End("spark-2", 1, "enp1s0f1np1")
    assert fabric.links[0].subnet == IPv4Network("10.0.0.0/24")


def test_a_3_ring_node_gets_each_cable_its_own_subnets():
    from sparkcluster.engine.inventory import Host, Inventory
    from sparkcluster.node.addressing import fabric_config, plan_addresses

    facts, answers = cabled(RING3, NODES3)
    fabric = build_fabric(NODES3, facts, answers)
    hosts = tuple(Host(n, f"192.168.1.{10 + i}", "head" if i == 1 else "worker") for i, n in enumerate(NODES3, 1))
    inv = Inventory(Path("inv.yml"), "t", hosts, {"fabric": {"topology": "ring"}})
    plans = {h.name: plan_addresses(inv, h, facts[h.name], fabric_config(inv, h), fabric=fabric) for h in hosts}
    got = {n: {t.netdev: str(t.address) for t in p.twins} for n, p in plans.items()}
    assert got["spark-1"] == {"enp1s0f0np0": "192.168.177.11/24", "enP2p1s0f0np0": "192.168.178.11/24",
                              "enp1s0f1np1": "192.168.179.11/24", "enP2p1s0f1np1": "192.168.180.11/24"}
    # Both ends of each cable share its subnets: spark-1 port 1 and spark-2 port 0 are cable 1.
    assert got["spark-2"]["enp1s0f0np0"] == "192.168.179.12/24"
    assert got["spark-3"]["enp1s0f1np1"] == "192.168.177.13/24"
    assert plans["spark-1"].port is None


def test_the_comm_env_per_topology_as_values():
    from sparkcluster.node.network import ring_env

    pair = {"VLLM_HOST_IP": "192.168.177.11", "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
            "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "NCCL_IB_GID_INDEX": "3"}
    hcas = ["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"]
    ring3 = ring_env(pair, 3, hcas, "192.168.1.11", "enP7s7", 24)
    assert ring3 == {"VLLM_HOST_IP": "192.168.1.11", "RAY_NODE_IP_ADDRESS": "192.168.1.11",
                     "RAY_OVERRIDE_NODE_IP_ADDRESS": "192.168.1.11", "MN_IF_NAME": "enP7s7",
                     "UCX_NET_DEVICES": "enP7s7", "NCCL_SOCKET_IFNAME": "enP7s7",
                     "OMPI_MCA_btl_tcp_if_include": "enP7s7", "GLOO_SOCKET_IFNAME": "enP7s7",
                     "TP_SOCKET_IFNAME": "enP7s7", "NCCL_IB_HCA": ",".join(hcas),
                     "NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_NET_GDR_LEVEL": "0"}
    ring4 = ring_env(pair, 4, hcas, "192.168.1.11", "enP7s7", 24)
    assert {k: v for k, v in ring4.items() if k not in ring3} == {
        "NCCL_ALGO": "Ring", "NCCL_SKIP_TREE_CONNECT": "1", "NCCL_IB_SUBNET_PREFIX_LEN": "24",
        "NCCL_MIN_NCHANNELS": "8", "NCCL_P2P_LEVEL": "SYS"}


def ring3_addressed() -> dict[str, HostFacts]:
    """A 3-ring after bootstrap: cable 0 (spark-1 port 0 - spark-3 port 1) on .177/.178, cable 1 (spark-1 port 1 -
    spark-2 port 0) on .179/.180, cable 2 (spark-2 port 1 - spark-3 port 0) on .181/.182."""
    plan = {"spark-1": {"enp1s0f0np0": 177, "enP2p1s0f0np0": 178, "enp1s0f1np1": 179, "enP2p1s0f1np1": 180},
            "spark-2": {"enp1s0f0np0": 179, "enP2p1s0f0np0": 180, "enp1s0f1np1": 181, "enP2p1s0f1np1": 182},
            "spark-3": {"enp1s0f0np0": 181, "enP2p1s0f0np0": 182, "enp1s0f1np1": 177, "enP2p1s0f1np1": 178}}
    return {n: node(i, {0, 1}, {d: f"192.168.{net}.{10 + i}/24" for d, net in plan[n].items()})
            for i, n in enumerate(NODES3, start=1)}


def ring4_addressed() -> dict[str, HostFacts]:
    """A 4-ring cabled crosswise, addressed as bootstrap plans it."""
    from sparkcluster.engine.inventory import Host, Inventory
    from sparkcluster.node.addressing import fabric_config, plan_addresses

    f4, answers = cabled(RING4, NODES4)
    ring4 = build_fabric(NODES4, f4, answers)
    hosts = tuple(Host(n, f"192.168.1.{10 + i}", "head" if i == 1 else "worker") for i, n in enumerate(NODES4, 1))
    inv = Inventory(Path("inv.yml"), "t", hosts, {})
    return {h.name: replace(f4[h.name], interfaces=tuple(
        replace(i, ipv4=tuple(t.address for t in plan_addresses(inv, h, f4[h.name], fabric_config(inv, h),
                                                                 fabric=ring4).twins if t.netdev == i.name) or i.ipv4)
        for i in f4[h.name].interfaces)) for h in hosts}


def test_data_goes_along_the_cables_and_the_control_plane_on_the_lan_on_a_ring():
    from sparkcluster.engine.inventory import Host
    from sparkcluster.node.network import cable_order, control_address, facing

    facts = ring3_addressed()
    # Each hop on the cable between its two nodes: spark-1 reaches spark-2 at spark-2's end of cable 1.
    assert facing(facts["spark-1"], facts["spark-2"]) == ("192.168.179.11", "192.168.179.12")
    assert facing(facts["spark-2"], facts["spark-3"]) == ("192.168.181.12", "192.168.181.13")
    assert cable_order(["spark-2", "spark-1", "spark-3"], facts) == ["spark-2", "spark-1", "spark-3"]
    # On a 4-ring there is no diagonal: the chain walks neighbours, never spark-1 -> spark-3.
    addressed = ring4_addressed()
    assert facing(addressed["spark-1"], addressed["spark-3"]) is None
    assert cable_order(NODES4, addressed) == ["spark-1", "spark-2", "spark-3", "spark-4"]
    assert cable_order(["spark-1", "spark-3", "spark-2", "spark-4"], addressed) == NODES4
    # The control plane: a ring node binds to its inventory (management) address, a pair node to its QSFP one.
    assert control_address(Host("spark-2", "192.168.1.12", "worker"), facts["spark-2"]) == "192.168.1.12"
    pair = node(1, {1}, {"enp1s0f1np1": "192.168.177.11/24", "enP2p1s0f1np1": "192.168.178.11/24"})
    assert control_address(Host("spark-1", "192.168.1.11", "head"), pair) == "192.168.177.11"


def test_ranks_along_the_ring():
    from sparkcluster.node.network import rank_order

    assert rank_order(["a", "b", "c"], 1) == ["a", "b", "c"]  # PP 3: the walk
    assert rank_order(["a", "b", "c", "d"], 2) == ["a", "b", "d", "c"]  # TP 2 x PP 2: stage 1 reversed, so a->d and b->c ride cables
    assert rank_order(["a", "b", "c", "d"], 4) == ["a", "b", "c", "d"]  # TP 4: one stage
    assert rank_order(["a", "b", "c"], 2) == ["a", "b", "c"]  # no TP x PP fits: as walked


def test_a_fresh_twin_is_retuned_once_in_the_change_and_its_rollback():
    """A twin without an address and at MTU 1500 is both to retune and to assign; its MTU line came twice before."""
    from sparkcluster.engine.inventory import Host, Inventory
    from sparkcluster.node.addressing import fabric_config, plan_addresses
    from sparkcluster.node.steps.addresses import FabricAddresses

    facts = {"spark-1": replace(node(1, {1}), interfaces=tuple(replace(i, mtu=1500) for i in node(1, {1}).interfaces))}
    inv = Inventory(Path("inv.yml"), "t", (Host("spark-1", "192.168.1.11", "head"),), {})
    plan = plan_addresses(inv, inv.hosts[0], facts["spark-1"], fabric_config(inv, inv.hosts[0]))
    assert len(plan.to_assign) == 2 and len(plan.to_retune) == 2

    class Ctx:
        host = inv.hosts[0]

        def run(self, command):  # the SSH session arrives on the management port
            from sparkcluster.engine.transport import Result
            return Result(command, 0, "enP7s7\n", "", 0.0)

    (command,) = FabricAddresses(None)._commands(Ctx(), plan, "", fabric_config(inv, inv.hosts[0]))  # type: ignore[arg-type]
    script = command.display()
    assert script.count("ip link set enp1s0f1np1 mtu 9000") == 1
    assert script.count("ip link set enp1s0f1np1 mtu 1500") == 1


def test_a_silent_node_is_not_a_miscabling():
    """Three nodes on a switch, spark-3's twins without addresses (not even link-local): it answers nothing and
    sees nothing, so spark-1 and spark-2 look cabled to each other. That is an incomplete picture, not a mixed or
    open cabling: the preflight and addressing deal with spark-3, the cabling check refuses nothing."""
    facts, answers = cabled([], NODES3, switch_ports={n: 1 for n in NODES3})
    facts["spark-3"] = replace(facts["spark-3"], interfaces=tuple(
        replace(i, ipv4=(), ipv6_link_local=()) if i.name in TWINS[1] else i for i in facts["spark-3"].interfaces))
    silenced = {a for i in cabled([], NODES3, switch_ports={n: 1 for n in NODES3})[0]["spark-3"].interfaces
                for a in i.ipv6_link_local}
    answers = {n: {d: tuple(a for a in seen if a not in silenced) for d, seen in by.items()} for n, by in answers.items()}
    answers["spark-3"] = {d: () for d in TWINS[1]}
    fabric = build_fabric(NODES3, facts, answers)
    assert fabric.kind is Kind.OTHER and fabric.silent and not fabric.complete
    assert cabling_problems(fabric) == [] and cabling_problems(fabric, "switch") == []
    # Only one twin of spark-3 silent: twin 1 is still a switch, twin 0 looks direct; still no refusal.
    answers["spark-3"] = {TWINS[1][0]: ()}
    answers["spark-3"][TWINS[1][1]] = ("fe80::1:11", "fe80::2:11")
    for n in ("spark-1", "spark-2"):
        answers[n][TWINS[1][1]] += ("fe80::3:11",)
    facts["spark-3"] = cabled([], NODES3, switch_ports={n: 1 for n in NODES3})[0]["spark-3"]
    fabric = build_fabric(NODES3, facts, answers)
    assert fabric.kind is Kind.MIXED and fabric.silent == (End("spark-3", 1, TWINS[1][0]),)
    assert cabling_problems(fabric) == []


def test_a_node_with_no_link_up_is_left_to_the_preflight():
    """spark-3's cabled links down: it has no Up twin; spark-1 and spark-2 see only each other."""
    fabric = graph(NODES3, [("spark-1", 1, "spark-2", 1)])
    assert fabric.silent_nodes == ("spark-3",) and fabric.kind is Kind.OTHER
    assert cabling_problems(fabric) == []


def test_image_sync_fans_out_along_the_cables():
    """`image sync`'s hops: the head to every node at once where one subnet joins them (a pair, a switch), on the
    control-plane addresses as before; on a ring a chain through neighbours, each hop on its cable's own subnet
    (a 4-ring never the diagonal spark-1 -> spark-3); a node that holds the image already still passes it on."""
    from sparkcluster.staging.hops import Hop, image_hops

    lan = {n: f"192.168.1.{10 + i}" for i, n in enumerate(NODES4, start=1)}
    ring3 = ring3_addressed()
    assert image_hops("spark-1", NODES3, {"spark-2", "spark-3"}, ring3, lan) == [
        Hop("spark-1", ("spark-2",), {"spark-1": "192.168.179.11", "spark-2": "192.168.179.12"}),
        Hop("spark-2", ("spark-3",), {"spark-2": "192.168.181.12", "spark-3": "192.168.181.13"})]
    ring4 = ring4_addressed()
    hops = image_hops("spark-1", NODES4, {"spark-3", "spark-4"}, ring4, lan)  # spark-2 holds it: it relays
    assert [(h.source, h.receivers) for h in hops] == [("spark-2", ("spark-3",)), ("spark-3", ("spark-4",))]
    for hop in hops:
        (a, ip_a), (b, ip_b) = hop.ips.items()
        assert ip_a.rsplit(".", 1)[0] == ip_b.rsplit(".", 1)[0] and (a, b) != ("spark-1", "spark-3")
    assert image_hops("spark-1", NODES4, set(), ring4, lan) == []
    # A switch: one subnet from the head to all; the head sends to every node at once on its control addresses.
    on_switch = {n: node(i, {1}, {"enp1s0f1np1": f"192.168.177.{10 + i}/24"}) for i, n in enumerate(NODES4, 1)}
    qsfp = {n: f"192.168.177.{10 + i}" for i, n in enumerate(NODES4, start=1)}
    assert image_hops("spark-1", NODES4, set(NODES4[1:]), on_switch, qsfp) == [
        Hop("spark-1", ("spark-2", "spark-3", "spark-4"), qsfp)]
    # No walk through neighbours (an open 4-ring): the head sends to each on the addresses every node reaches.
    open4 = {**ring4, "spark-3": node(3, set())}
    assert image_hops("spark-1", NODES4, {"spark-2", "spark-4"}, open4, lan) == [
        Hop("spark-1", ("spark-2", "spark-4"), {n: lan[n] for n in ("spark-1", "spark-2", "spark-4")})]
