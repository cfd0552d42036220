"""Fact parsers on outputs captured from real Sparks (tests/fixtures/) and their variations."""

from ipaddress import IPv4Interface
from pathlib import Path

import pytest

from sparkcluster.engine.facts import (
    driver_tuple, parse_docker, parse_ethtool_speed, parse_ibdev2netdev, parse_nvidia_smi_csv, parse_probe,
    parse_sysfs,
)

FIXTURES = Path(__file__).parents[2] / "fixtures"


def test_whole_probe_from_a_real_spark():
    f = parse_probe((FIXTURES / "probe-spark.txt").read_text())
    assert (f.arch, f.kernel, f.os, f.hostname) == ("aarch64", "6.17.0-1032-nvidia", "Ubuntu 24.04.3 LTS", "spark-a1b2")
    assert (f.user, f.uid, f.home) == ("spark", 1000, "/home/spark") and "docker" in f.groups
    assert f.gpu.name == "NVIDIA GB10" and f.gpu.driver_version == "580.159.03" and f.gpu.compute_cap == "12.1"
    assert f.rdma_source == "ibdev2netdev"
    assert [(d.hca, d.netdev, d.up) for d in f.rdma if d.up] == [
        ("roceP2p1s0f1", "enP2p1s0f1np1", True), ("rocep1s0f1", "enp1s0f1np1", True)]
    qsfp = f.interface("enp1s0f1np1")
    assert qsfp.ipv4 == (IPv4Interface("192.168.177.11/24"),) and qsfp.mtu == 9000 and qsfp.speed_mbps == 200000
    assert f.interface("enp1s0f0np0").speed_mbps is None  # "Unknown!" and sysfs -1: no link
    assert f.interface("enP7s7").speed_mbps == 10000
    v2_ipv4 = [g for g in f.gids if g.type == "RoCE v2" and g.ipv4_mapped and g.hca == "rocep1s0f1"]
    assert [(g.index, g.gid[-9:]) for g in v2_ipv4] == [(3, "c0a8:b10b")]
    assert f.docker.usable and f.docker.server_version == "29.2.1" and f.docker.nvidia_runtime
    assert f.hf_cache == "/home/spark/.cache/huggingface" and f.hf_free_bytes == 3134862988 * 1024


def test_whole_probe_from_a_simulated_spark_with_docker_denied():
    f = parse_probe((FIXTURES / "probe-sim.txt").read_text())
    assert f.hostname == "spark-1" and f.gpu.driver_version == "590.48.01"
    assert f.docker.installed and f.docker.daemon_up and not f.docker.usable
    assert "permission denied" in f.docker.error
    assert f.interface("enP2p1s0f1np1").ipv4 == (IPv4Interface("10.100.1.11/24"),)


@pytest.mark.parametrize("lines,expected", [
    (["NVIDIA GB10, 580.173.02", "rc=0"], ("NVIDIA GB10", "580.173.02", None)),
    (["name, driver_version", "NVIDIA GB10, 580.173.02", "rc=0"], ("NVIDIA GB10", "580.173.02", None)),
    (["NVIDIA GB10, 580.95.05, [N/A]", "rc=0"], ("NVIDIA GB10", "580.95.05", None)),
    (["NVIDIA GB10, 580.142, 12.1", "rc=0"], ("NVIDIA GB10", "580.142", "12.1")),
])
def test_nvidia_smi_variants(lines, expected):
    gpus, error = parse_nvidia_smi_csv(lines)
    assert error is None
    assert (gpus[0].name, gpus[0].driver_version, gpus[0].compute_cap) == expected


def test_nvidia_smi_missing_or_failing():
    assert parse_nvidia_smi_csv(["@missing"]) == ((), "nvidia-smi not found (no NVIDIA driver installed?)")
    gpus, error = parse_nvidia_smi_csv([
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "rc=9"])
    assert gpus == () and "couldn't communicate" in error


def test_ibdev2netdev_missing_falls_back_to_sysfs():
    text = (FIXTURES / "probe-spark.txt").read_text().replace(
        "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)\nroceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\n"
        "rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)\nrocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n", "@missing\n")
    f = parse_probe(text)
    assert f.rdma_source == "sysfs"
    assert {d.hca for d in f.rdma if d.up} == {"rocep1s0f1", "roceP2p1s0f1"}
    assert parse_ibdev2netdev(["@missing"]) is None
    devices, gids = parse_sysfs(["/sys/class/infiniband/rocep1s0f1/ports/1/state:4: ACTIVE",
                                 "/sys/class/infiniband/rocep1s0f1/ports/1/gids/5:0000:0000:0000:0000:0000:0000:0000:0000"])
    assert devices[0].netdev == "" and devices[0].up
    assert gids == ()  # an unused GID slot is not an entry


def test_sysfs_gid_table_from_a_real_spark_has_the_roce_v2_ipv4_gid_at_index_3():
    f = parse_probe((FIXTURES / "probe-spark.txt").read_text())
    entry = next(g for g in f.gids if g.hca == "rocep1s0f1" and g.index == 3)
    assert (entry.type, entry.netdev, entry.ipv4_mapped) == ("RoCE v2", "enp1s0f1np1", True)


def test_speeds_and_versions():
    assert parse_ethtool_speed("200000Mb/s") == 200000
    assert parse_ethtool_speed("Unknown!") is None
    assert driver_tuple("580.95.05") == (580, 95, 5) and driver_tuple("590.44") == (590, 44)
    assert driver_tuple("580.95.05") < driver_tuple("590.44") <= driver_tuple("590.48.01")


def test_docker_not_installed():
    d = parse_docker(["cli=", "dockerd=", "socket=no", "nvidia="])
    assert not d.installed and not d.usable and d.error == "docker is not installed"


def test_empty_output_yields_empty_facts_not_an_exception():
    f = parse_probe("")
    assert f.gpus == () and f.rdma == () and f.interfaces == () and f.uid == -1


def mlx5_named(text: str) -> str:
    """The same Spark on a kernel that names its RDMA devices by PCI order (mlx5_0..3), in every section."""
    for roce, mlx5 in (("roceP2p1s0f0", "mlx5_2"), ("roceP2p1s0f1", "mlx5_3"), ("rocep1s0f0", "mlx5_0"),
                       ("rocep1s0f1", "mlx5_1")):
        text = text.replace(roce, mlx5)
    return text


@pytest.mark.parametrize("source", ["ibdev2netdev", "sysfs"])
def test_mlx5_names_map_to_their_netdevs_and_are_used_as_they_are(source):
    from sparkcluster.node.network import choose_qsfp, comm_env
    text = mlx5_named((FIXTURES / "probe-spark.txt").read_text())
    if source == "sysfs":  # no MLNX OFED: the mapping comes from /sys/class/infiniband/*/device/net
        text = text.replace("\n".join(line for line in text.splitlines() if " ==> " in line), "@missing")
    f = parse_probe(text)
    assert f.rdma_source == source
    assert {(d.hca, d.netdev) for d in f.rdma if d.up} == {("mlx5_1", "enp1s0f1np1"), ("mlx5_3", "enP2p1s0f1np1")}
    choice = choose_qsfp(f)
    assert comm_env(choice)["NCCL_IB_HCA"] in ("mlx5_3,mlx5_1", "mlx5_1,mlx5_3") and choice.gid_index == 3
    assert choice.port == 1 and choice.warnings == ()
