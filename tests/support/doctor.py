"""A healthy Spark as the doctor's probe reads it, for the tests that need one to change."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sparkcluster.engine.facts import PcieLink, parse_probe
from sparkcluster.node.health import parse_health
from sparkcluster.node.parity import Node

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FACTS = parse_probe((FIXTURES / "probe-spark.txt").read_text())
HEALTH = parse_health((FIXTURES / "doctor" / "health-spark.txt").read_text(), "vllm-node")
X4 = tuple(PcieLink(n, "32.0_GT/s_PCIe", "4", "32.0_GT/s_PCIe", "4") for n in ("enp1s0f1np1", "enP2p1s0f1np1"))


def healthy() -> Node:
    health = replace(HEALTH, cma_total_kb=65536, nccl_conf=(), nccl_env=(), memlock="unlimited",
                     bios_date="04/20/2026", image=replace(HEALTH.image, nccl_conf=()))
    return Node(replace(FACTS, pcie_links=X4), health)
