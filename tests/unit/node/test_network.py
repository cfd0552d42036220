"""QSFP choice and comm env, on facts parsed from real-shaped probes (tests/fixtures) and edited variations of them."""

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from sparkcluster.engine.facts import Gid, HostFacts, RdmaDevice, parse_probe
from sparkcluster.node.network import (
    QsfpChoice, QsfpError, cabling_report, choose_qsfp, comm_env, fabric_subnet_mismatch, qsfp_port,
)

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"


def spark() -> HostFacts:
    return parse_probe((FIXTURES / "probe-spark.txt").read_text())


def with_interface(facts: HostFacts, name: str, **changes) -> HostFacts:
    return replace(facts, interfaces=tuple(replace(i, **changes) if i.name == name else i for i in facts.interfaces))


def with_up(facts: HostFacts, **up: bool) -> HostFacts:
    return replace(facts, rdma=tuple(replace(d, up=up.get(d.hca, d.up)) for d in facts.rdma))


def roce_v2_gid(hca: str, netdev: str, index: int, ip: str) -> Gid:
    mapped = "".join(f"{int(octet):02x}" for octet in ip.split("."))
    return Gid(hca, 1, index, f"0000:0000:0000:0000:0000:ffff:{mapped[:4]}:{mapped[4:]}", netdev, "RoCE v2")


def both_ports_up() -> HostFacts:
    """Both QSFP ports cabled; port 0's twins addressed on /24s of their own."""
    facts = with_up(spark(), rocep1s0f0=True, roceP2p1s0f0=True)
    facts = replace(facts, gids=(*facts.gids, roce_v2_gid("rocep1s0f0", "enp1s0f0np0", 3, "192.168.100.11"),
                                 roce_v2_gid("roceP2p1s0f0", "enP2p1s0f0np0", 3, "192.168.101.11")))
    facts = with_interface(facts, "enp1s0f0np0", state="UP", mtu=9000, ipv4=("192.168.100.11/24",), speed_mbps=200000)
    return with_interface(facts, "enP2p1s0f0np0", state="UP", mtu=9000, ipv4=("192.168.101.11/24",), speed_mbps=200000)


def cabled_on_port_0(facts: HostFacts) -> HostFacts:
    """The same Spark with the cable in port 0: every port-1 name becomes its port-0 name and back."""
    def swapped(name: str) -> str:  # only the function and port digits move, not the PCIe bus (p1s0, P2)
        head, sep, tail = name.rpartition("s0f")
        return head + sep + tail.translate(str.maketrans("01", "10")) if sep else name

    rdma = sorted((replace(d, hca=swapped(d.hca), netdev=swapped(d.netdev)) for d in facts.rdma), key=lambda d: d.hca)
    return replace(facts, rdma=tuple(rdma),
                   gids=tuple(replace(g, hca=swapped(g.hca), netdev=swapped(g.netdev)) for g in facts.gids),
                   interfaces=tuple(replace(i, name=swapped(i.name)) for i in facts.interfaces))


SPARK_ENV = {
    "VLLM_HOST_IP": "192.168.177.11",
    "RAY_NODE_IP_ADDRESS": "192.168.177.11",
    "RAY_OVERRIDE_NODE_IP_ADDRESS": "192.168.177.11",
    "MN_IF_NAME": "enp1s0f1np1",
    "UCX_NET_DEVICES": "enp1s0f1np1",
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
    "NCCL_IB_HCA": "roceP2p1s0f1,rocep1s0f1",
    "NCCL_IB_DISABLE": "0",
    "OMPI_MCA_btl_tcp_if_include": "enp1s0f1np1",
    "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
    "TP_SOCKET_IFNAME": "enp1s0f1np1",
    "RAY_memory_monitor_refresh_ms": "0",
    "NCCL_IGNORE_CPU_AFFINITY": "1",
    "NCCL_IB_GID_INDEX": "3",
}


# ---- golden values -----------------------------------------------------------------------------------------
def test_real_spark_cabled_on_port_1():
    choice = choose_qsfp(spark())
    assert choice == QsfpChoice(netdev="enp1s0f1np1", ip="192.168.177.11", prefix=24,
                                hcas=("roceP2p1s0f1", "rocep1s0f1"), twins=("enP2p1s0f1np1", "enp1s0f1np1"), port=1,
                                gid_index=3, mtu=9000, speed_mbps=200000, source="detected", warnings=())
    env = comm_env(choice)
    assert env == SPARK_ENV
    assert list(env) == list(SPARK_ENV)  # the order is part of the contract: eugr's env file lists them so


def test_simulated_spark():
    choice = choose_qsfp(parse_probe((FIXTURES / "probe-sim.txt").read_text()))
    assert (choice.netdev, choice.ip, choice.prefix, choice.gid_index) == ("enp1s0f1np1", "10.100.0.11", 24, 3)
    assert choice.hcas == ("roceP2p1s0f1", "rocep1s0f1") and choice.warnings == ()
    assert comm_env(choice)["VLLM_HOST_IP"] == "10.100.0.11"


def test_cabled_on_port_0():
    choice = choose_qsfp(cabled_on_port_0(spark()))
    assert (choice.netdev, choice.port, choice.ip) == ("enp1s0f0np0", 0, "192.168.177.11")
    assert choice.twins == ("enP2p1s0f0np0", "enp1s0f0np0") and choice.warnings == ()
    env = comm_env(choice)
    assert env["NCCL_IB_HCA"] == "roceP2p1s0f0,rocep1s0f0" and env["NCCL_IB_GID_INDEX"] == "3"
    assert {env[k] for k in ("MN_IF_NAME", "UCX_NET_DEVICES", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include",
                             "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")} == {"enp1s0f0np0"}


@pytest.mark.parametrize("netdev,port", [
    ("enp1s0f0np0", 0), ("enP2p1s0f0np0", 0), ("enp1s0f1np1", 1), ("enP2p1s0f1np1", 1),
    ("enP7s7", None), ("eth0", None), ("enp1s0f1np0", None), ("", None),
])
def test_qsfp_port_from_netdev_names(netdev, port):
    assert qsfp_port(netdev) == port


def test_sysfs_only_source_gives_the_same_choice():
    """Without MLNX OFED there is no ibdev2netdev; /sys/class/infiniband gives the same devices, sorted by name."""
    sysfs = (RdmaDevice("roceP2p1s0f0", 1, "enP2p1s0f0np0", False), RdmaDevice("roceP2p1s0f1", 1, "enP2p1s0f1np1", True),
             RdmaDevice("rocep1s0f0", 1, "enp1s0f0np0", False), RdmaDevice("rocep1s0f1", 1, "enp1s0f1np1", True))
    choice = choose_qsfp(replace(spark(), rdma=sysfs, rdma_source="sysfs"))
    assert choice == choose_qsfp(spark()) and choice.hcas == ("roceP2p1s0f1", "rocep1s0f1")


# ---- degraded links: warnings --------------------------------------------------------------------------------
def test_one_twin_down_halves_the_bandwidth():
    choice = choose_qsfp(with_up(spark(), roceP2p1s0f1=False))
    assert choice.netdev == "enp1s0f1np1" and choice.hcas == ("rocep1s0f1",) and choice.twins == ("enp1s0f1np1",)
    assert len(choice.warnings) == 1
    assert "one twin of QSFP port 1" in choice.warnings[0] and "not Up" in choice.warnings[0]
    assert "half the bandwidth (F2)" in choice.warnings[0]


def test_twin_without_address_the_other_is_chosen():
    choice = choose_qsfp(with_interface(spark(), "enp1s0f1np1", ipv4=()))
    assert (choice.netdev, choice.ip, choice.gid_index) == ("enP2p1s0f1np1", "192.168.178.11", 3)
    assert choice.hcas == ("roceP2p1s0f1", "rocep1s0f1")  # the Up twin still carries RDMA
    assert len(choice.warnings) == 1 and choice.warnings[0].startswith("enp1s0f1np1, the twin of enP2p1s0f1np1, has no IPv4")


def test_twin_without_address_keeps_the_preferred_one():
    choice = choose_qsfp(with_interface(spark(), "enP2p1s0f1np1", ipv4=()))
    assert choice.netdev == "enp1s0f1np1"
    assert [w.split(",")[0] for w in choice.warnings] == ["enP2p1s0f1np1"]


def test_mtu_1500_warns():
    choice = choose_qsfp(with_interface(spark(), "enp1s0f1np1", mtu=1500))
    assert choice.mtu == 1500
    assert len(choice.warnings) == 1 and ("enp1s0f1np1 has MTU 1500 (RoCE path MTU 1024, under 4096): 9000 is "
                                          "recommended") in choice.warnings[0]


@pytest.mark.parametrize("mtu, roce", [(1500, 1024), (2200, 2048), (4200, 4096), (9000, 4096), (1280, 1024)])
def test_roce_path_mtu_follows_the_netdev_mtu(mtu, roce):
    from sparkcluster.node.network import roce_path_mtu
    assert roce_path_mtu(mtu) == roce


@pytest.mark.parametrize("speed,warned", [(100000, True), (200000, False), (None, False)])
def test_link_speed_below_200g_warns(speed, warned):
    choice = choose_qsfp(with_interface(spark(), "enP2p1s0f1np1", speed_mbps=speed))
    assert [w for w in choice.warnings if "F21" in w] == (
        ["enP2p1s0f1np1 negotiated 100000 Mb/s, not 200000 (F21): use a 200G-rated cable, or force 200G on the switch port"]
        if warned else [])


def test_both_ports_up_uses_one_port_and_warns():
    choice = choose_qsfp(both_ports_up())
    # autodiscover.sh's rule: the first Up, addressed netdev without a capital P in ibdev2netdev order
    assert (choice.netdev, choice.port, choice.hcas) == ("enp1s0f0np0", 0, ("roceP2p1s0f0", "rocep1s0f0"))
    assert len(choice.warnings) == 1
    assert "Up on QSFP port 1 too; only QSFP port 0 (enp1s0f0np0) is used" in choice.warnings[0]


def test_several_addresses_take_the_first_and_warn():
    choice = choose_qsfp(with_interface(spark(), "enp1s0f1np1", ipv4=("192.168.177.11/24", "192.168.177.21/24")))
    assert choice.ip == "192.168.177.11"
    assert choice.warnings == ("enp1s0f1np1 has 2 IPv4 addresses (192.168.177.11/24, 192.168.177.21/24); using the "
                               "first (set fabric_ip to choose another)",)


def test_no_roce_v2_ipv4_gid_leaves_the_gid_index_to_nccl():
    facts = spark()
    facts = replace(facts, gids=tuple(g for g in facts.gids if not (g.ipv4_mapped and g.type == "RoCE v2")))
    choice = choose_qsfp(facts)
    assert choice.gid_index is None
    assert "NCCL_IB_GID_INDEX" not in comm_env(choice) and list(comm_env(choice))[-1] == "NCCL_IGNORE_CPU_AFFINITY"
    assert len(choice.warnings) == 1 and "rocep1s0f1 has no RoCE v2 GID for an IPv4 address" in choice.warnings[0]


def test_twins_disagreeing_on_the_gid_index_warn():
    facts = spark()
    moved = tuple(replace(g, index=5) if (g.hca, g.index) == ("roceP2p1s0f1", 3) else g for g in facts.gids)
    choice = choose_qsfp(replace(facts, gids=moved))
    assert choice.gid_index is None and "NCCL_IB_GID_INDEX" not in comm_env(choice)
    assert choice.warnings == ("roceP2p1s0f1 has its RoCE v2 IPv4 GID at index 5, not 3 (that of 192.168.177.11 on "
                               "rocep1s0f1): NCCL_IB_GID_INDEX, which applies to every HCA, is left unset",)


def test_a_twin_with_no_ipv4_gid_is_never_named_by_the_gid_index():
    """A twin with no IPv4 address has only its IPv6 link-local RoCE GIDs: index 3 does not exist on it."""
    facts = spark()
    bare = replace(facts, gids=tuple(g for g in facts.gids if not (g.hca == "roceP2p1s0f1" and g.ipv4_mapped)))
    choice = choose_qsfp(bare)
    assert choice.gid_index is None and "NCCL_IB_GID_INDEX" not in comm_env(choice)
    assert choice.hcas == ("roceP2p1s0f1", "rocep1s0f1")
    assert [w for w in choice.warnings if "roceP2p1s0f1 (enP2p1s0f1np1) has no RoCE v2 IPv4 GID" in w]


# ---- unusable links: errors ----------------------------------------------------------------------------------
def test_no_rdma_devices():
    with pytest.raises(QsfpError) as e:
        choose_qsfp(replace(spark(), rdma=(), rdma_source="none"))
    assert e.value.message == "no RDMA devices found (ibdev2netdev / /sys/class/infiniband)"
    assert "OFED" in e.value.fix and "ibdev2netdev" in e.value.fix


def test_no_up_device():
    with pytest.raises(QsfpError) as e:
        choose_qsfp(with_up(spark(), roceP2p1s0f1=False, rocep1s0f1=False))
    assert "no RDMA device is Up (roceP2p1s0f0 -> enP2p1s0f0np0 (Down)" in e.value.message
    assert "not connected" in e.value.message and "(Up)" in e.value.fix


def test_no_up_twin_has_an_address():
    facts = with_interface(with_interface(spark(), "enp1s0f1np1", ipv4=()), "enP2p1s0f1np1", ipv4=())
    with pytest.raises(QsfpError) as e:
        choose_qsfp(facts)
    assert e.value.message == "the Up QSFP interfaces (enP2p1s0f1np1, enp1s0f1np1) have no IPv4 address"
    assert "`sudo ip addr add 192.168.177.11/24 dev enp1s0f1np1`" in e.value.fix and "netplan" in e.value.fix


def test_twins_on_the_same_subnet():
    with pytest.raises(QsfpError) as e:
        choose_qsfp(with_interface(spark(), "enP2p1s0f1np1", ipv4=("192.168.177.12/24",)))
    assert e.value.message.startswith("enp1s0f1np1 (192.168.177.11/24) and its twin enP2p1s0f1np1 (192.168.177.12/24) "
                                      "are on the same subnet")
    assert "(F9)" in e.value.message
    assert ("`sudo ip addr del 192.168.177.12/24 dev enP2p1s0f1np1 && sudo ip addr add 192.168.178.12/24 dev "
            "enP2p1s0f1np1`") in e.value.fix


def test_management_nic_on_the_qsfp_subnet():
    with pytest.raises(QsfpError, match=r"and enP7s7 \(192.168.177.50/24\) are on the same subnet"):
        choose_qsfp(with_interface(spark(), "enP7s7", ipv4=("192.168.177.50/24",)))


# ---- pins ----------------------------------------------------------------------------------------------------
def test_pinned_interface():
    choice = choose_qsfp(spark(), pin_interface="enP2p1s0f1np1")
    assert (choice.netdev, choice.ip, choice.port, choice.gid_index) == ("enP2p1s0f1np1", "192.168.178.11", 1, 3)
    assert choice.hcas == ("roceP2p1s0f1", "rocep1s0f1") and choice.source == "pinned" and choice.warnings == ()


def test_pinned_ip_selects_its_interface():
    choice = choose_qsfp(spark(), pin_ip="192.168.178.11")
    assert (choice.netdev, choice.ip, choice.source) == ("enP2p1s0f1np1", "192.168.178.11", "pinned")


def test_pinned_interface_and_ip():
    choice = choose_qsfp(spark(), pin_interface="enp1s0f1np1", pin_ip="192.168.177.11")
    assert replace(choice, source="detected") == choose_qsfp(spark()) and choice.source == "pinned"


def test_pinned_ip_chooses_among_addresses_and_its_gid():
    facts = with_interface(spark(), "enp1s0f1np1", ipv4=("192.168.177.11/24", "192.168.177.21/24"))
    extra = roce_v2_gid("rocep1s0f1", "enp1s0f1np1", 5, "192.168.177.21")
    choice = choose_qsfp(replace(facts, gids=(*facts.gids, extra)), pin_ip="192.168.177.21")
    # The second address's GID sits at another index than the twin's, and NCCL_IB_GID_INDEX is one for all HCAs:
    # naming 5 would give roceP2p1s0f1 a GID it lacks, so it is left to NCCL.
    assert (choice.ip, choice.gid_index) == ("192.168.177.21", None)
    assert choice.warnings == ("roceP2p1s0f1 has its RoCE v2 IPv4 GID at index 3, not 5 (that of 192.168.177.21 on "
                               "rocep1s0f1): NCCL_IB_GID_INDEX, which applies to every HCA, is left unset",)


def test_pinned_hcas_keep_their_order():
    choice = choose_qsfp(spark(), pin_hcas=["rocep1s0f1", "roceP2p1s0f1"])
    assert choice.hcas == ("rocep1s0f1", "roceP2p1s0f1") and choice.twins == ("enp1s0f1np1", "enP2p1s0f1np1")
    assert choice.netdev == "enp1s0f1np1" and choice.source == "pinned" and choice.warnings == ()


def test_pinned_single_hca_warns_half_bandwidth():
    choice = choose_qsfp(spark(), pin_hcas=["rocep1s0f1"])
    assert choice.hcas == ("rocep1s0f1",)
    assert len(choice.warnings) == 1 and "hcas pins only one of them" in choice.warnings[0]


def test_pinned_hcas_narrow_the_interface_to_their_port():
    choice = choose_qsfp(both_ports_up(), pin_hcas=["roceP2p1s0f1", "rocep1s0f1"])
    assert (choice.netdev, choice.port, choice.ip) == ("enp1s0f1np1", 1, "192.168.177.11")
    assert len(choice.warnings) == 1 and "Up on QSFP port 0 too" in choice.warnings[0]


def test_pinned_hca_on_another_port_than_the_interface_warns():
    choice = choose_qsfp(both_ports_up(), pin_interface="enp1s0f1np1", pin_hcas=["rocep1s0f0", "roceP2p1s0f0"])
    assert choice.hcas == ("rocep1s0f0", "roceP2p1s0f0")
    assert [w for w in choice.warnings if w.startswith("hcas:")] == [
        f"hcas: {hca} ({netdev}) is not on the QSFP port of enp1s0f1np1: NCCL may pair it with a port the peer is not "
        "cabled to (F6)" for hca, netdev in (("rocep1s0f0", "enp1s0f0np0"), ("roceP2p1s0f0", "enP2p1s0f0np0"))]


@pytest.mark.parametrize("pins,message", [
    ({"pin_interface": "enp9s0"}, "qsfp_interface enp9s0: no such interface (here: lo, enP7s7, enp1s0f0np0, "),
    ({"pin_interface": "enP7s7"}, "qsfp_interface enP7s7 is not a QSFP interface: no RDMA device maps to it "
                                  "(Up RDMA netdevs: enP2p1s0f1np1, enp1s0f1np1)"),
    ({"pin_interface": "enp1s0f0np0"}, "qsfp_interface enp1s0f0np0 is Down (rocep1s0f0 -> enp1s0f0np0 (Down); "
                                       "Up: enP2p1s0f1np1, enp1s0f1np1)"),
    ({"pin_interface": "enp1s0f1np1", "pin_ip": "192.168.178.11"},
     "fabric_ip 192.168.178.11 is not an address of enp1s0f1np1 (it has 192.168.177.11/24)"),
    ({"pin_ip": "192.168.1.50"}, "fabric_ip 192.168.1.50: it is on enP7s7, which is not an Up QSFP interface "
                                 "(QSFP addresses here: enP2p1s0f1np1 192.168.178.11/24, enp1s0f1np1 192.168.177.11/24)"),
    ({"pin_ip": "10.0.0.1"}, "fabric_ip 10.0.0.1: no interface here has it"),
    ({"pin_hcas": ["rocep1s0f1", "mlx5_0"]}, "hcas: there is no RDMA device mlx5_0 (here: roceP2p1s0f0 -> "),
    ({"pin_hcas": ["rocep1s0f0"]}, "hcas: rocep1s0f0 (enp1s0f0np0) is Down (Up: roceP2p1s0f1 -> enP2p1s0f1np1 (Up), "
                                   "rocep1s0f1 -> enp1s0f1np1 (Up))"),
])
def test_wrong_pins(pins, message):
    with pytest.raises(QsfpError) as e:
        choose_qsfp(spark(), **pins)
    assert e.value.message.startswith(message)
    assert e.value.fix


def test_pinned_interface_without_address():
    with pytest.raises(QsfpError) as e:
        choose_qsfp(with_interface(spark(), "enP2p1s0f1np1", ipv4=()), pin_interface="enP2p1s0f1np1")
    assert e.value.message == "qsfp_interface enP2p1s0f1np1 has no IPv4 address"
    assert "`sudo ip addr add 192.168.177.11/24 dev enP2p1s0f1np1`" in e.value.fix


# ---- env and env file ----------------------------------------------------------------------------------------
def test_comm_env_refuses_values_a_shell_would_interpret():
    with pytest.raises(QsfpError, match=r"MN_IF_NAME='x\$\(reboot\)' cannot be written"):
        comm_env(replace(choose_qsfp(spark()), netdev="x$(reboot)"))


def test_comm_env_file_template():
    templates = Environment(undefined=StrictUndefined, loader=FileSystemLoader(ROOT / "templates"),
                            keep_trailing_newline=True)
    text = templates.get_template("comm.env.j2").render(env=comm_env(choose_qsfp(spark())), host="spark-1",
                                                        generated_by="sparkcluster 0.1.0 bootstrap")
    # Bare KEY=value lines: docker --env-file would keep quotes and reject `export` as part of the name.
    assert text.splitlines() == [
        "# Written by sparkcluster for spark-1 (sparkcluster 0.1.0 bootstrap): how its comm traffic binds to its QSFP link.",
        "# Do not edit by hand: `sparkcluster bootstrap` rewrites this file.",
        "# Plain KEY=value lines (no quotes, no export): `docker run --env-file` reads them literally; "
        "`set -a; . FILE` exports them.",
        *(f"{key}={value}" for key, value in SPARK_ENV.items()),
    ]
    assert text.endswith("NCCL_IB_GID_INDEX=3\n") and not text.endswith("\n\n")


# ---- across nodes --------------------------------------------------------------------------------------------
def test_cabling_report_names_the_node_on_another_port():
    port1, port0 = choose_qsfp(spark()), choose_qsfp(cabled_on_port_0(spark()))
    assert cabling_report({"spark-1": port1, "spark-2": port0}) == [
        "spark-2 is cabled on QSFP port 0 (enp1s0f0np0), the other on QSFP port 1 (enp1s0f1np1): fine for sparkcluster, "
        "which configures each node from its own interfaces, but eugr's scripts assume identical names (F22; NVIDIA "
        "recommends the same port on every node)"]
    three = cabling_report({"spark-1": port1, "spark-2": port0, "spark-3": port0})
    assert len(three) == 1 and three[0].startswith("spark-1 is cabled on QSFP port 1 (enp1s0f1np1), the others on QSFP port 0")


def test_cabling_report_names_a_node_bound_to_the_other_twin():
    other_twin = choose_qsfp(spark(), pin_interface="enP2p1s0f1np1")
    lines = cabling_report({"spark-1": choose_qsfp(spark()), "spark-2": other_twin})
    assert len(lines) == 1 and lines[0].startswith("spark-2 binds to enP2p1s0f1np1, the other to enp1s0f1np1: ")


def test_cabling_report_is_empty_when_all_agree():
    worker = replace(choose_qsfp(spark()), ip="192.168.177.12")
    assert cabling_report({"spark-1": choose_qsfp(spark()), "spark-2": worker}) == []
    assert cabling_report({}) == []


def test_fabric_subnet_mismatch():
    head = choose_qsfp(spark())
    same = replace(head, ip="192.168.177.12")
    other = replace(head, ip="192.168.178.12")
    assert fabric_subnet_mismatch({"spark-1": head, "spark-2": same}) == []
    assert fabric_subnet_mismatch({"spark-1": head, "spark-2": same, "spark-3": other}) == [
        "spark-3's QSFP address 192.168.178.12/24 (enp1s0f1np1) is not on the head spark-1's subnet 192.168.177.0/24 "
        "(enp1s0f1np1 192.168.177.11/24): they cannot reach each other directly over the QSFP link; give enp1s0f1np1 "
        "an address in 192.168.177.0/24"]
    assert fabric_subnet_mismatch({}) == []


def test_fabric_subnet_mismatch_needs_both_directions_on_link():
    wide_head = replace(choose_qsfp(spark()), ip="10.100.0.11", prefix=16)
    narrow_worker = replace(wide_head, ip="10.100.5.12", prefix=24)  # in the head's /16, but the head is not in its /24
    assert [line.split("'")[0] for line in fabric_subnet_mismatch({"h": wide_head, "w": narrow_worker})] == ["w"]


def test_comm_env_file_is_sourced_by_a_posix_shell(tmp_path):
    templates = Environment(undefined=StrictUndefined, loader=FileSystemLoader(ROOT / "templates"),
                            keep_trailing_newline=True)
    env_file = tmp_path / "comm.env"
    env_file.write_text(templates.get_template("comm.env.j2").render(env=SPARK_ENV, host="spark-1", generated_by="test"))
    out = subprocess.run(["sh", "-c", f'set -a; . "{env_file}"; env'], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}).stdout
    exported = dict(line.split("=", 1) for line in out.splitlines() if line.split("=", 1)[0] in SPARK_ENV)
    assert exported == SPARK_ENV


# ---- every node's binding (verify reads each node's serving env) ---------------------------------------------
def test_comm_env_bound_to_the_management_port_is_named_with_node_variable_and_value():
    from ipaddress import IPv4Network

    from sparkcluster.nccl.binding import misbindings, parse_env
    facts = spark()
    choice = choose_qsfp(facts)
    fabric = [IPv4Network("192.168.177.0/24")]
    good = comm_env(choice)
    assert misbindings("spark-2", good, choice, facts, fabric) == []
    shell = "\n".join(f"{k}={v}" for k, v in {**good, "GLOO_SOCKET_IFNAME": "enP7s7", "MASTER_ADDR": "10.20.0.11",
                                              "NCCL_SOCKET_IFNAME": "^docker0,lo", "PATH": "/usr/bin"}.items())
    found = [str(m) for m in misbindings("spark-2", parse_env(shell), choice, facts, fabric)]
    assert found == [
        "spark-2: GLOO_SOCKET_IFNAME=enP7s7 names enP7s7 (the management port; the QSFP link is enp1s0f1np1)",
        "spark-2: MASTER_ADDR=10.20.0.11 is off the QSFP link; this node's QSFP address is 192.168.177.11",
    ]
    # An address of this node held by another interface is named with that interface.
    lan = next(i for i in facts.interfaces if i.name == "enP7s7" and i.ipv4)
    wrong = {**good, "VLLM_HOST_IP": str(lan.ipv4[0].ip), "NCCL_SOCKET_IFNAME": "=enp1s0f1np1"}
    assert [str(m) for m in misbindings("spark-2", wrong, choice, facts, fabric)] == [
        f"spark-2: VLLM_HOST_IP={lan.ipv4[0].ip} is off the QSFP link (on enP7s7); this node's QSFP address is "
        "192.168.177.11"]


def test_preflight_reads_the_pcie_link_and_the_kernels_connectx_power_messages():
    from sparkcluster.engine.facts import parse_link_health
    health = parse_link_health([
        "pcie enp1s0f1np1 32.0_GT/s_PCIe 4 32.0_GT/s_PCIe 4",
        "pcie enP2p1s0f1np1 8.0_GT/s_PCIe 2 32.0_GT/s_PCIe 4",
        "pcie enp1s0f0np0 - - - -",
        "kmsg [ 8734.226153] mlx5_core 0002:01:00.1: mlx5_pcie_event:299:(pid 0): Detected insufficient power on "
        "the PCIe slot (27W).",
    ])
    facts = replace(spark(), **health)
    assert [link.degraded for link in facts.pcie_links] == [False, True, False]
    warnings = choose_qsfp(facts).warnings
    assert warnings[0].startswith("enP2p1s0f1np1: PCIe link at 8.0 GT/s PCIe x2, below its 32.0 GT/s PCIe x4")
    assert warnings[1].startswith("kernel: [ 8734.226153] mlx5_core 0002:01:00.1: mlx5_pcie_event:299:(pid 0): "
                                  "Detected insufficient power on the PCIe slot (27W).: reboot both nodes")
    assert choose_qsfp(spark()).warnings == ()  # a healthy Spark says nothing
