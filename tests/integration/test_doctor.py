"""`sparkcluster doctor` on one simulated 3-node cluster: a clean cluster passes; a node given another driver,
kernel (without CMA), BIOS (with a twin at x2) or image, or a planted /etc/nccl.conf, is named with the fix.

The hardware values come from the emulators (`sim hardware`); the image is a real Docker image, the same ID on
every node (copied with docker save | load), and one node's is rebuilt with another NCCL."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from sparkcluster.sim import SimCluster, UpOptions, image
from tests.helpers import require_sim, run_cli, ssh, unique_name

pytestmark = [pytest.mark.sim, pytest.mark.docker]

NCCL_LIB = "/usr/local/lib/libnccl.so.{}"
VLLM_DIST = "/usr/lib/python3/dist-packages/vllm-0.11.1.dist-info"


def rebuild_image(cluster: SimCluster, host: str, nccl: str) -> None:
    """What `docker build` on one node leaves: the same tag, another ID, this NCCL and vLLM 0.11.1 inside."""
    ssh(cluster, host, f"docker rm -f rebuild >/dev/null 2>&1; docker run --name rebuild {image.DEFAULT_TAG} sh -c "
                       f"'rm -f /usr/local/lib/libnccl.so.*; mkdir -p /usr/local/lib {VLLM_DIST}; "
                       f"touch {NCCL_LIB.format(nccl)}' && docker commit rebuild {image.DEFAULT_TAG} >/dev/null && "
                       "docker rm rebuild >/dev/null", user="root")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    require_sim(docker=True)
    c = SimCluster.up(UpOptions(count=3, name=unique_name("doctor")))
    try:
        tar = image.build(with_torch=False)
        image.import_into(c, ["spark-1"], image.DEFAULT_TAG, tar)
        rebuild_image(c, "spark-1", "2.28.3")
        for other in ("spark-2", "spark-3"):  # the same ID everywhere, as `sparkcluster image sync` leaves it
            save = subprocess.Popen([*c.ssh_argv("spark-1", "root"), f"docker save {image.DEFAULT_TAG}"],
                                    stdout=subprocess.PIPE)
            subprocess.run([*c.ssh_argv(other, "root"), "docker load -q"], stdin=save.stdout, check=True,
                           capture_output=True, timeout=300)
            assert save.wait(60) == 0
        yield c
    finally:
        c.down()


def doctor(cluster: SimCluster) -> tuple[int, dict]:
    result = run_cli("doctor", "-i", str(cluster.inventory_path), "--json", timeout=300)
    return result.returncode, json.loads(result.stdout)


def named(report: dict, check: str) -> list[dict]:
    return [f for f in report["findings"] if f["check"] == check and f["severity"] != "ok"]


def short_of_disk(cluster: SimCluster, hosts: list[str]) -> dict[str, bool | None]:
    """Per node: whether its HF cache really has less than bootstrap's 50 GiB floor free (None: too near to say).
    A simulated node's disk (its home holds the cache) is this machine's: on a nearly full machine, a clean
    cluster is rightly warned."""
    verdicts: dict[str, bool | None] = {}
    for host in hosts:
        avail = int(ssh(cluster, host, "df -B1 --output=avail ~ | tail -1").stdout)
        verdicts[host] = None if abs(avail - 50 * 2**30) < 2**30 else avail < 50 * 2**30
    return verdicts


def test_a_clean_cluster_passes(sim):
    code, report = doctor(sim)
    short = short_of_disk(sim, list(report["nodes"]))
    disk_warned = {n for f in report["findings"] if f["check"] == "preflight.disk" and f["severity"] == "warn"
                   for n in f["nodes"]}
    assert all(short[n] is not False for n in disk_warned), (disk_warned, short)
    assert all(n in disk_warned for n, is_short in short.items() if is_short), (disk_warned, short)
    bad = [f["summary"] for f in report["findings"] if f["severity"] != "ok" and f["check"] != "preflight.disk"]
    assert code == 0 and report["ok"] and not bad, bad
    health = {n: v["health"] for n, v in report["nodes"].items()}
    assert {h["image"]["nccl"] for h in health.values()} == {"2.28.3"}
    assert {h["image"]["vllm"] for h in health.values()} == {"0.11.1"}
    assert len({h["image"]["id"] for h in health.values()}) == 1
    checks = {f["check"] for f in report["findings"]}
    assert {"preflight.gpu", "preflight.fabric", "driver", "kernel", "BIOS", "ConnectX firmware", "CmaTotal"} <= checks


def test_nodes_given_another_driver_kernel_or_bios_are_named(sim):
    sim.set_hardware("spark-2", {"driver": "580.95.05", "kernel": "7.0.0-1019-nvidia", "cma_total_kb": 0})
    sim.set_hardware("spark-3", {"bios_version": "sim-5.20", "bios_date": "01/15/2026",
                                 "pcie_width": {"enP2p1s0f1np1": "2"}})
    try:
        code, report = doctor(sim)
    finally:
        for host in ("spark-2", "spark-3"):
            sim.set_hardware(host, dict.fromkeys(("driver", "kernel", "cma_total_kb", "bios_version", "bios_date",
                                                  "pcie_width")))
    assert code == 1 and not report["ok"]
    for check, node in (("driver", "spark-2"), ("kernel", "spark-2"), ("CmaTotal", "spark-2"), ("BIOS", "spark-3"),
                        ("PCIe link of the twins", "spark-3"), ("CMA", "spark-2"), ("PCIe", "spark-3")):
        found = named(report, check)
        assert found and found[0]["nodes"] == [node] and found[0]["fix"], (check, found)
    assert "7.0.0-1019-nvidia" in named(report, "CMA")[0]["summary"]
    assert "before April 2026" in named(report, "PCIe")[0]["summary"]
    assert named(report, "preflight.driver")[0]["nodes"] == ["spark-2"]  # 580.95.05 is below the floor too
    # put back: the cluster is clean again
    assert doctor(sim)[0] == 0


def test_nccl_conf_planted_on_one_node_is_named(sim):
    ssh(sim, "spark-3", "printf 'NCCL_P2P_LEVEL=SYS\\n' > /etc/nccl.conf", user="root")
    try:
        code, report = doctor(sim)
        text = run_cli("doctor", "-i", str(sim.inventory_path)).stdout
    finally:
        ssh(sim, "spark-3", "rm -f /etc/nccl.conf", user="root")
    assert code == 1
    conf = named(report, "nccl.conf")
    assert conf and conf[0]["nodes"] == ["spark-3"] and "NCCL_P2P_LEVEL=SYS" in conf[0]["summary"]
    assert "sudo rm /etc/nccl.conf" in conf[0]["fix"]
    assert named(report, "NCCL config files")[0]["nodes"] == ["spark-3"]
    assert "spark-3: /etc/nccl.conf sets NCCL_P2P_LEVEL=SYS" in text and "fix: remove it" in text


def test_an_image_rebuilt_with_another_nccl_is_named(sim):
    rebuild_image(sim, "spark-2", "2.27.7")
    code, report = doctor(sim)
    assert code == 1
    for check in ("image ID", "NCCL in the image"):
        assert named(report, check)[0]["nodes"] == ["spark-2"], check
    assert "2.27.7" in named(report, "NCCL in the image")[0]["summary"]
    assert "image sync" in named(report, "image ID")[0]["fix"]
