"""A ConnectX that initialised degraded (issue 42): its twin's link reports 200G and full PCIe width, yet verify
measures a small fraction of its peers' (or of one twin's rate on real Sparks): named as that, with the fix (reload
the driver, or power-cycle with AC removed). A twin at PCIe x2, or one that carried nothing, stays what it was."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sparkcluster.engine.facts import HostFacts, PcieLink, parse_probe
from sparkcluster.nccl.finding import VerdictStatus
from sparkcluster.nccl.links import Measured, degraded_init, named_degraded
from sparkcluster.nccl.twins import Twin, TwinMeasure, judge_twins

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TWINS = ("enp1s0f1np1", "enP2p1s0f1np1")


def spark(width: dict[str, str] | None = None, speed: int = 200000) -> HostFacts:
    base = parse_probe((FIXTURES / "probe-spark.txt").read_text())
    pcie = tuple(PcieLink(n, "32.0_GT/s_PCIe", (width or {}).get(n, "4"), "32.0_GT/s_PCIe", "4") for n in TWINS)
    interfaces = tuple(replace(i, speed_mbps=speed) if i.name in TWINS else i for i in base.interfaces)
    return replace(base, pcie_links=pcie, interfaces=interfaces)


def twin(index: int) -> Twin:
    netdev = TWINS[index]
    return Twin(index, {"spark-1": netdev, "spark-2": netdev}, {}, {})


def measured(*busbw: float | None) -> list[Measured]:
    return [Measured(twin(i).label, b, tuple(twin(i).netdevs.items())) for i, b in enumerate(busbw)]


def test_a_twin_at_full_rate_that_carries_a_fraction_is_named_degraded_init_with_the_fix():
    """The field's report: 200G and Gen5 x4 on both ends, a few GB/s where its twin carries 12."""
    facts = {"spark-1": spark(), "spark-2": spark()}
    measures = [TwinMeasure(twin(0), 11.9), TwinMeasure(twin(1), 1.6)]
    slow = judge_twins(measures, "spark-1")
    assert slow is not None and slow.cause.startswith("twin 1 (enP2p1s0f1np1) is degraded")  # before: no cause named
    verdict = named_degraded(slow, measured(11.9, 1.6), facts, "nccl")
    assert verdict is not None and verdict.status is VerdictStatus.FAIL
    assert verdict.cause.startswith("twin 1 (enP2p1s0f1np1) initialised degraded: both ends report 200G, 32.0 GT/s "
                                    "PCIe x4 of x4"), verdict.cause
    assert "1.60 GB/s alone, 13% of its peers' median 11.90 GB/s" in verdict.cause
    assert "sudo rmmod mlx5_ib mlx5_core; sudo modprobe mlx5_core" in verdict.fix and "AC removed" in verdict.fix
    assert "spark-1 or spark-2" in verdict.fix and verdict.details == slow.details


def test_on_real_sparks_the_link_rate_alone_is_enough():
    facts = {"spark-1": spark(), "spark-2": spark()}
    found = degraded_init(measured(2.8), facts, rate_gbps=12.5)
    assert found is not None and "22% of the 12.5 GB/s one twin carries" in found.cause
    assert degraded_init(measured(2.8), facts, rate_gbps=None) is None  # no peer and no rate: nothing to hold it to


def test_a_twin_at_pcie_x2_is_not_a_degraded_initialisation():
    facts = {"spark-1": spark({TWINS[1]: "2"}), "spark-2": spark()}
    assert degraded_init(measured(11.9, 1.6), facts, rate_gbps=12.5) is None


def test_a_link_below_200g_or_a_quarter_of_its_peers_or_more_is_not_one():
    assert degraded_init(measured(11.9, 1.6), {"spark-1": spark(speed=100000), "spark-2": spark()}, None) is None
    assert degraded_init(measured(11.9, 3.5), {"spark-1": spark(), "spark-2": spark()}, None) is None


def test_a_dead_twin_stays_named_as_dead():
    facts = {"spark-1": spark(), "spark-2": spark()}
    dead = judge_twins([TwinMeasure(twin(0), None, "timeout"), TwinMeasure(twin(1), 1.2)], "spark-1")
    assert named_degraded(dead, measured(None, 1.2), facts, "nccl") == dead
