"""The doctor's node probe parsed from outputs in the formats real Sparks print, and its findings: nodes that
differ named against the others, the known-bad kernel/CMA, BIOS/PCIe and nccl.conf values named with the fix."""

from __future__ import annotations

from dataclasses import replace

from sparkcluster.engine.facts import PcieLink
from sparkcluster.node.health import ImageProbe, health_command, parse_image
from sparkcluster.node.parity import Node, Severity, bios_date, known_issues, parity
from tests.support.doctor import FACTS, HEALTH, X4, healthy


def test_the_probe_reads_every_section():
    h = HEALTH
    assert h.dgx_release == "DGX Spark 7.2.3"
    assert (h.bios_version, h.bios_date, h.product) == ("5.36_0ACUM020", "01/22/2026", "DGX Spark")
    assert h.cuda == "13.0" and h.host_nccl == "2.27.7"
    assert h.firmware == {"enp1s0f1np1": "28.45.1200 (NVD0000000033)", "enP2p1s0f1np1": "28.45.1200 (NVD0000000033)"}
    assert h.nccl_conf[0].path == "/etc/nccl.conf" and h.nccl_conf[0].lines == ("NCCL_P2P_DISABLE=1", "NCCL_IB_DISABLE=0")
    assert h.nccl_env == ("NCCL_DEBUG=INFO (login environment)", "NCCL_SOCKET_IFNAME=enP7s7 (/home/spark/.bashrc)")
    assert (h.cma_total_kb, h.mem_total_kb, h.memlock) == (0, 124544304, "8192")
    # The library the image links wins over the wheel and the base image's NCCL_VERSION beside it.
    assert (h.image.nccl, h.image.vllm, h.image.torch) == ("2.28.3", "0.11.1rc2.dev161+g7f2c4a", "2.9.0a0+50eac811a6.nv25.9")
    assert h.image.id and h.image.id.startswith("sha256:3f1c") and h.image.error is None
    assert h.image.nccl_conf == ("NCCL_IB_TIMEOUT=22",) and h.image.env["CUDA_VERSION"] == "13.0.1"


def test_image_answers_that_are_not_a_scan():
    assert parse_image("x", ["absent Error response from daemon: No such image: x:latest"]).error == "no image 'x'"
    denied = parse_image("x", ["absent permission denied while trying to connect to the Docker daemon socket"])
    assert denied.error and "group docker" in denied.error
    assert parse_image("x", ["missing docker"]).error == "docker is not installed"
    unscanned = parse_image("x", ["id sha256:ab", 'docker: Error response from daemon: exec: "sh": not found'])
    assert unscanned.id == "sha256:ab" and unscanned.error and "could not look inside" in unscanned.error
    assert parse_image("", ["skipped"]) == ImageProbe("")


def test_the_image_name_is_quoted_into_the_script():
    script = health_command("vllm-node;rm -rf /").script
    assert "img='vllm-node;rm -rf /'" in script


def test_alike_nodes_pass():
    nodes = {n: healthy() for n in ("spark-1", "spark-2", "spark-3")}
    found = parity(nodes) + [f for n, node in nodes.items() for f in known_issues(n, node)]
    assert found and all(f.severity is Severity.OK for f in found), [f.summary for f in found if f.severity is not Severity.OK]


def test_the_node_that_differs_is_named_against_the_majority():
    odd = healthy()
    odd = Node(replace(odd.facts, gpus=(replace(odd.facts.gpus[0], driver_version="580.95.05"),)),
               replace(odd.health, image=replace(odd.health.image, id="sha256:99", nccl="2.27.7")))
    found = {f.check: f for f in parity({"spark-1": healthy(), "spark-2": odd, "spark-3": healthy()})}
    for check in ("driver", "image ID", "NCCL in the image"):
        assert found[check].severity is Severity.FAIL and found[check].nodes == ("spark-2",), found[check]
        assert "spark-2" in found[check].summary and found[check].fix
    assert "580.95.05" in found["driver"].summary and "590" not in found["driver"].summary.split("(")[0]
    assert found["kernel"].severity is Severity.OK


def test_two_nodes_that_differ_are_both_named():
    odd = healthy()
    odd = Node(replace(odd.facts, kernel="6.17.0-1026-nvidia"), odd.health)
    kernel = next(f for f in parity({"spark-1": healthy(), "spark-2": odd}) if f.check == "kernel")
    assert kernel.severity is Severity.FAIL and kernel.nodes == ("spark-1", "spark-2")


def test_kernel_without_cma_is_named_with_the_fix():
    node = Node(replace(FACTS, kernel="7.0.0-1019-nvidia", pcie_links=X4), replace(healthy().health, cma_total_kb=0))
    cma = [f for f in known_issues("spark-2", node) if f.check == "CMA"]
    assert cma and cma[0].severity is Severity.FAIL and "7.0.0-1019-nvidia" in cma[0].summary
    assert "ibv_reg_mr" in cma[0].summary and "CmaTotal" in cma[0].fix
    assert not [f for f in known_issues("spark-1", healthy()) if f.check == "CMA"]


def test_an_old_bios_with_a_twin_at_x2_is_named_with_the_bios_fix():
    narrow = (X4[0], PcieLink("enP2p1s0f1np1", "32.0_GT/s_PCIe", "2", "32.0_GT/s_PCIe", "4"))
    node = Node(replace(FACTS, pcie_links=narrow), replace(healthy().health, bios_date="01/22/2026"))
    pcie = [f for f in known_issues("spark-3", node) if f.check == "PCIe"]
    assert pcie and pcie[0].severity is Severity.FAIL and "enP2p1s0f1np1" in pcie[0].summary
    assert "before April 2026" in pcie[0].summary and "fwupdmgr" in pcie[0].fix
    newer = Node(node.facts, replace(node.health, bios_date="05/02/2026"))
    assert "reboot" in next(f for f in known_issues("spark-3", newer) if f.check == "PCIe").fix
    assert bios_date("04/01/2026") is not None and bios_date("garbage") is None


def test_nccl_conf_on_the_host_or_in_the_image_and_stray_nccl_variables_are_named():
    node = Node(replace(FACTS, pcie_links=X4), HEALTH)
    found = known_issues("spark-1", node)
    confs = [f for f in found if f.check == "nccl.conf"]
    assert len(confs) == 2 and all(f.severity is Severity.FAIL for f in confs)
    assert "/etc/nccl.conf" in confs[0].summary and "NCCL_P2P_DISABLE=1" in confs[0].summary
    assert "image vllm-node" in confs[1].summary
    stray = next(f for f in found if f.check == "NCCL_* outside the comm env")
    assert stray.severity is Severity.WARN and ".bashrc" in stray.summary
    # memlock matters where vLLM runs from the host, not in a container
    assert not [f for f in found if f.check == "memlock"]
    assert [f for f in known_issues("spark-1", node, host_runtime=True) if f.check == "memlock"]
