import ipaddress

import pytest

from sparkcluster.sim.hardware import _ipv4_gid, gid_table, hardware_doc, write_infiniband_tree
from sparkcluster.sim.netns import host_batch, lan_shaping, root_batch
from sparkcluster.sim.topology import MGMT_NETDEV, Subnets, build_topology


def topo(count=2, **kw):
    return build_topology("lab", count, Subnets(120), kw.pop("drivers", ["590.48.01"]), **kw)


def test_hosts_get_spark_names_and_eugr_style_addresses():
    t = topo(3)
    assert [h.name for h in t.hosts] == ["spark-1", "spark-2", "spark-3"]
    assert [h.mgmt_ip for h in t.hosts] == ["192.168.120.11", "192.168.120.12", "192.168.120.13"]
    assert t.hosts[0].fabric_ips == ("10.120.0.11", "10.120.1.11")


def test_each_host_has_the_spark_nics_with_the_cabled_twins_on_separate_subnets():
    h = topo().hosts[0]
    assert [n.netdev for n in h.nics] == [MGMT_NETDEV, "enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"]
    cabled = [n for n in h.nics if n.hca and n.cabled]
    assert [(n.netdev, n.hca) for n in cabled] == [("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")]
    a, b = (n.address.network for n in cabled)
    assert a != b
    assert all(n.mtu == 9000 for n in cabled)
    assert h.nic(MGMT_NETDEV).mtu == 1500


def test_port0_cabling_moves_the_addresses_to_port_0_twins():
    t = topo(2, port0_hosts=frozenset({"spark-2"}))
    h2 = t.hosts[1]
    assert h2.cabled_port == 0
    assert {n.netdev for n in h2.nics if n.cabled and n.hca} == {"enp1s0f0np0", "enP2p1s0f0np0"}
    assert h2.fabric_ips == ("10.120.0.12", "10.120.1.12")  # same wire, different port names


def test_drivers_one_for_all_or_one_per_host():
    assert [h.driver_version for h in topo(2, drivers=["580.95.05"]).hosts] == ["580.95.05"] * 2
    assert [h.driver_version for h in topo(2, drivers=["580.95.05", "590.44"]).hosts] == ["580.95.05", "590.44"]
    with pytest.raises(ValueError, match="one per host"):
        topo(3, drivers=["1.2", "3.4"])


@pytest.mark.parametrize("count", [0, 201])
def test_host_count_bounds(count):
    with pytest.raises(ValueError):
        topo(count)


def test_unknown_port0_host_is_rejected():
    with pytest.raises(ValueError, match="spark-9"):
        topo(2, port0_hosts=frozenset({"spark-9"}))


def test_root_namespace_names_fit_the_kernel_limit_even_for_large_clusters():
    t = build_topology("x" * 20, 200, Subnets(254), ["590.48.01"])
    names = [*t.bridges, *(n.root_end for h in t.hosts for n in h.nics)]
    assert max(len(n) for n in names) <= 15
    assert len(set(names)) == len(names)


def test_network_commands_never_add_a_route_and_set_jumbo_mtu_on_both_veth_ends():
    t = topo(2)
    lines = root_batch(t) + [l for h in t.hosts for l in host_batch(h)]
    assert not any("route" in l for l in lines)
    fabric = [l for l in lines if "peer name enp1s0f1np1" in l]
    assert fabric and all(l.count("mtu 9000") == 2 for l in fabric)
    # every bridge carries the runner's address, so fabric traffic from here never follows the default route
    assert sum(l.startswith("addr add") and "dev sc120" in l and "fe80" not in l for l in root_batch(t)) == 3
    # the unplugged port's twins are created but never brought up
    assert not any("enp1s0f0np0" in l for h in t.hosts for l in host_batch(h))


def test_lan_shaping_limits_both_directions_of_every_management_link():
    t = topo(2)
    root_lines, host_lines = lan_shaping(t, "750mbit")
    assert root_lines == [f"qdisc add dev {h.nic(MGMT_NETDEV).root_end} root tbf rate 750mbit burst 256kb latency 50ms"
                          for h in t.hosts]
    assert all(lines == ["qdisc add dev enP7s7 root tbf rate 750mbit burst 256kb latency 50ms"]
               for lines in host_lines.values())


def test_ipv4_mapped_gid_matches_the_captured_spark_format():
    # as a real Spark's sysfs GID table shows it: 192.168.177.11 -> 0000:0000:0000:0000:0000:ffff:c0a8:b10b
    assert _ipv4_gid(ipaddress.IPv4Address("192.168.177.11")) == "0000:0000:0000:0000:0000:ffff:c0a8:b10b"


def test_gid_table_has_roce_v2_ipv4_entry_only_on_addressed_ports():
    h = topo().hosts[0]
    up = h.nic("enp1s0f1np1")
    down = h.nic("enp1s0f0np0")
    assert [kind for _, kind in gid_table(up)] == ["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"]
    assert gid_table(up)[3][0].endswith(":0a78:000b")  # 10.120.0.11
    assert len(gid_table(down)) == 2
    assert gid_table(up)[0][0].startswith("fe80:0000:0000:0000:")


def test_infiniband_tree_shape(tmp_path):
    h = topo().hosts[0]
    write_infiniband_tree(h, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    assert (tmp_path / "rocep1s0f1/ports/1/state").read_text() == "4: ACTIVE\n"
    assert (tmp_path / "rocep1s0f0/ports/1/state").read_text() == "1: DOWN\n"
    assert [p.name for p in (tmp_path / "rocep1s0f1/device/net").iterdir()] == ["enp1s0f1np1"]
    assert (tmp_path / "roceP2p1s0f1/ports/1/gid_attrs/types/3").read_text() == "RoCE v2\n"


def test_hardware_doc_is_a_gb10_with_the_hosts_driver():
    doc = hardware_doc("lab", topo(2, drivers=["580.95.05", "590.44"]).hosts[1])
    assert doc["gpu"]["name"] == "NVIDIA GB10"
    assert doc["gpu"]["driver_version"] == "590.44"
    assert doc["gpu"]["compute_cap"] == "12.1"
    speeds = {n["netdev"]: n["speed_mbps"] for n in doc["nics"]}
    assert speeds["enp1s0f1np1"] == 200000 and speeds["enP7s7"] == 10000


def test_mlx5_names_follow_pci_order_and_link_local_is_nvidias_state():
    from sparkcluster.sim.netns import link_local_batch
    host = topo(2, rdma_names="mlx5").hosts[1]
    assert [(n.netdev, n.hca, n.cabled) for n in host.nics if n.hca] == [
        ("enp1s0f0np0", "mlx5_0", False), ("enP2p1s0f0np0", "mlx5_2", False),
        ("enp1s0f1np1", "mlx5_1", True), ("enP2p1s0f1np1", "mlx5_3", True)]
    assert link_local_batch(host) == ["addr add 169.254.20.12/16 dev enp1s0f1np1 scope link",
                                      "addr add 169.254.201.12/16 dev enP2p1s0f1np1 scope link"]
    with pytest.raises(ValueError, match="--rdma-names 'ib'"):
        topo(1, rdma_names="ib")


def test_the_infiniband_tree_shows_each_twins_pcie_link(tmp_path):
    from sparkcluster.engine.facts import parse_link_health
    host = topo(1).hosts[0]
    write_infiniband_tree(host, tmp_path)
    device = tmp_path / "rocep1s0f1" / "device"
    assert (device / "current_link_speed").read_text() == "32.0 GT/s PCIe\n"
    assert (device / "max_link_width").read_text() == "4\n"
    # The facts probe's line for it, as its shell loop prints it (spaces to underscores).
    line = "pcie enp1s0f1np1 " + " ".join((device / n).read_text().strip().replace(" ", "_") for n in
                                         ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width"))
    assert not parse_link_health([line])["pcie_links"][0].degraded


def cables_of(t):
    """(host, port) pairs per twin-0 wire: who the simulator cabled to whom."""
    return sorted(tuple((f"spark-{i}", p) for i, p, tw in w.ends) for w in t.wires if w.ends[0][2] == 0)


def test_a_3_ring_is_cabled_crosswise_each_cable_on_its_own_subnets():
    t = topo(3, kind="ring")
    assert cables_of(t) == [(("spark-1", 0), ("spark-3", 1)), (("spark-1", 1), ("spark-2", 0)),
                            (("spark-2", 1), ("spark-3", 0))]
    h1 = t.hosts[0]
    cabled = {n.netdev: str(n.address) for n in h1.nics if n.hca and n.cabled}
    # Cable 0 (spark-1 port 0 - spark-3) carries 10.120.0/1, cable 1 (spark-1 port 1 - spark-2) 10.120.2/3.
    assert cabled == {"enp1s0f0np0": "10.120.0.11/24", "enP2p1s0f0np0": "10.120.1.11/24",
                      "enp1s0f1np1": "10.120.2.11/24", "enP2p1s0f1np1": "10.120.3.11/24"}
    assert all(address is None for bridge, address in t.bridges.items() if not bridge.endswith("lan"))
    lines = root_batch(t)
    assert "link set sc120c0a addrgenmode none" in lines and not any("route" in l for l in lines)


def test_a_4_ring_has_four_cables_and_no_diagonal():
    t = topo(4, kind="ring")
    assert len(cables_of(t)) == 4
    assert (("spark-1", 1), ("spark-3", 0)) not in cables_of(t)


def test_a_pair_is_one_cable_and_a_switch_keeps_todays_bridges():
    assert cables_of(topo(2, kind="pair")) == [(("spark-1", 1), ("spark-2", 1))]
    t = topo(3)
    assert [w.bridge for w in t.wires] == ["sc120fa", "sc120fb"]
    assert t.bridges["sc120fa"] == ipaddress.IPv4Interface("10.120.0.1/24")


@pytest.mark.parametrize("miscable, count, kind, expected", [
    ("port0-port0", 3, "ring", [(("spark-1", 0), ("spark-2", 0)), (("spark-1", 1), ("spark-3", 1)),
                                (("spark-2", 1), ("spark-3", 0))]),
    ("missing-link", 4, "ring", [(("spark-1", 1), ("spark-2", 0)), (("spark-2", 1), ("spark-3", 0)),
                                 (("spark-3", 1), ("spark-4", 0))]),
    ("self", 3, "ring", [(("spark-1", 1), ("spark-2", 0)), (("spark-3", 0), ("spark-3", 1))]),
])
def test_each_miscabling(miscable, count, kind, expected):
    assert cables_of(topo(count, kind=kind, miscable=miscable)) == expected


def test_mixed_and_pinned_away():
    t = topo(3, kind="ring", miscable="mixed")
    assert [w.bridge for w in t.wires][:2] == ["sc120fa", "sc120fb"] and len(cables_of(t)) == 2
    p = topo(2, kind="pair", miscable="pinned-away")
    assert p.pins == (("spark-2", "enp1s0f1np1"),) and p.hosts[1].cabled_port == 0


@pytest.mark.parametrize("kw, match", [
    ({"count": 3, "kind": "pair"}, "a pair is 2 nodes"),
    ({"count": 2, "kind": "ring"}, "a ring is 3 to 8"),
    ({"count": 2, "kind": "pair", "miscable": "port0-port0"}, "needs --topology ring"),
    ({"count": 2, "kind": "mesh"}, "choose from"),
])
def test_impossible_cablings_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        topo(kw.pop("count"), **kw)
