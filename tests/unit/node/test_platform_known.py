"""The known-bad platform table (node/platform_known.py) and the doctor's reading of it: the CMA kernels named with
`kho=off` (how to set it in GRUB, how to check it) and CmaFree read against CmaTotal; a version that alone is
enough named with its symptom, fix and source; a listed kernel that booted with CMA not flagged."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from pathlib import Path

from sparkcluster.engine.facts import PcieLink, parse_probe
from sparkcluster.node.health import parse_health
from sparkcluster.node.parity import Node, Severity, known_issues
from sparkcluster.node.platform_known import KNOWN_BAD, Component, Symptom, matches

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FACTS = parse_probe((FIXTURES / "probe-spark.txt").read_text())
HEALTH = parse_health((FIXTURES / "doctor" / "health-spark.txt").read_text(), "vllm-node")
X4 = tuple(PcieLink(n, "32.0_GT/s_PCIe", "4", "32.0_GT/s_PCIe", "4") for n in ("enp1s0f1np1", "enP2p1s0f1np1"))


def node(kernel: str = "6.17.0-1032-nvidia", cmdline: str = "", **health: object) -> Node:
    h = replace(HEALTH, cma_total_kb=65536, nccl_conf=(), nccl_env=(), memlock="unlimited", bios_date="04/20/2026",
                image=replace(HEALTH.image, nccl_conf=()), cmdline=cmdline)
    return Node(replace(FACTS, kernel=kernel, pcie_links=X4), replace(h, **health))  # type: ignore[arg-type]


def test_every_entry_names_a_symptom_a_fix_and_where_it_was_reported():
    assert {k.component for k in KNOWN_BAD} == set(Component)
    for k in KNOWN_BAD:
        assert k.symptom and k.fix and k.sources, k
        assert all("#" in s for s in k.sources), k.sources  # a thread: owner/repo#N or a PR number


def test_the_cma_kernels_and_only_they_match():
    for kernel in ("7.0.0-1019-nvidia", "7.0.0-31-generic"):
        found = matches(Component.KERNEL, kernel)
        assert [k.shows for k in found] == [Symptom.CMA_ZERO] and "kho=off" in found[0].fix, kernel
    for kernel in ("6.17.0-1032-nvidia", "7.0.0-1020-nvidia", "7.0.0-310-generic", "", None):
        assert not matches(Component.KERNEL, kernel), kernel


def test_firmware_matches_on_its_version_not_its_psid_and_a_bios_on_its_date():
    assert matches(Component.FIRMWARE, "28.45.4028 (NVD0000000033)")
    assert not matches(Component.FIRMWARE, "28.45.1200 (NVD0000000033)")
    assert matches(Component.BIOS, "5.36_0ACUM020", date(2026, 1, 22))
    assert not matches(Component.BIOS, "5.36_0ACUM020", date(2026, 4, 20))
    assert not matches(Component.BIOS, "5.36_0ACUM020", None)  # no date: nothing to say from the table alone


def test_a_cma_kernel_at_cma_0_is_named_with_kho_off_how_to_set_it_and_the_giveaway():
    """The report: doctor named the CMA kernel but not kho=off, and read no CmaFree."""
    bad = node("7.0.0-31-generic", cma_total_kb=0, cma_free_kb=3456)
    cma = [f for f in known_issues("spark-2", bad) if f.check == "CMA"]
    assert len(cma) == 1 and cma[0].severity is Severity.FAIL and cma[0].nodes == ("spark-2",)
    assert "7.0.0-31-generic" in cma[0].summary and "CmaFree: 3456 kB" in cma[0].summary
    assert "CmaFree > CmaTotal is the whole giveaway" in cma[0].summary
    for step in ("kho=off", "GRUB_CMDLINE_LINUX_DEFAULT", "/etc/default/grub", "sudo update-grub", "reboot",
                 "cat /proc/cmdline", "grep Cma /proc/meminfo"):
        assert step in cma[0].fix, step
    assert "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259" in cma[0].source


def test_cmafree_above_cmatotal_is_named_even_where_cmatotal_is_not_0():
    cma = [f for f in known_issues("spark-1", node("7.0.0-1019-nvidia", cma_total_kb=1024, cma_free_kb=9999))
           if f.check == "CMA"]
    assert cma and cma[0].severity is Severity.FAIL and "giveaway" in cma[0].summary and "kho=off" in cma[0].fix


def test_kho_off_already_set_and_cma_still_0_names_the_next_step_and_a_good_one_is_not_flagged():
    stuck = [f for f in known_issues("spark-2", node("7.0.0-1019-nvidia", "BOOT_IMAGE=/vmlinuz ro quiet kho=off",
                                                          cma_total_kb=0, cma_free_kb=0)) if f.check == "CMA"]
    assert stuck and "already" in stuck[0].fix and "6.17.0-1032-nvidia" in stuck[0].fix
    fixed = node("7.0.0-1019-nvidia", "BOOT_IMAGE=/vmlinuz ro quiet kho=off", cma_total_kb=65536, cma_free_kb=60000)
    assert fixed.health.kho_off
    assert not [f for f in known_issues("spark-2", fixed) if f.severity is not Severity.OK]


def test_a_version_that_alone_is_enough_is_named_with_node_value_symptom_fix_and_source():
    odd = node(firmware={"enp1s0f1np1": "28.45.4028 (NVD0000000033)", "enP2p1s0f1np1": "28.45.4028 (NVD0000000033)"})
    found = [f for f in known_issues("spark-3", odd) if f.check == "known-bad ConnectX firmware"]
    assert len(found) == 1 and found[0].severity is Severity.WARN and found[0].nodes == ("spark-3",)
    assert "28.45.4028" in found[0].summary and "13 Gb/s" in found[0].summary
    assert "mlx5_core" in found[0].fix and found[0].source == "NVIDIA/dgx-spark-playbooks PR #108"
    # a driver whose trouble shows only in the kernel log is not named for its version alone
    assert not [f for f in known_issues("spark-3", node()) if f.check.startswith("known-bad")]


def test_the_bios_x2_finding_cites_the_table():
    narrow = (X4[0], PcieLink("enP2p1s0f1np1", "32.0_GT/s_PCIe", "2", "32.0_GT/s_PCIe", "4"))
    old = Node(replace(node().facts, pcie_links=narrow), replace(node().health, bios_date="01/22/2026"))
    pcie = next(f for f in known_issues("spark-3", old) if f.check == "PCIe")
    assert "fwupdmgr" in pcie.fix and "PR #35" in pcie.source
