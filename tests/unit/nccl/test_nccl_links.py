"""verify per link, as data: which runs measure each link of a pair, a 3-ring and a switch, what pins each rank to
its twin, the matrix, and the verdict that names a dead, slow or degraded link."""

from __future__ import annotations


from sparkcluster.engine.errors import SparkclusterError
from sparkcluster.nccl.links import LinkMeasure, judge_links, link_env, link_probes, matrix, measure_links
from sparkcluster.nccl.logs import BandwidthRow
from sparkcluster.nccl.twins import judged_twice
from sparkcluster.node.fabric import SWITCH, End, Fabric, Link
from tests.support.nccl import TWINS, measured, node, ring3


def rows(busbw: float) -> list[BandwidthRow]:
    return [BandwidthRow("all_reduce", 16 << 20, 1.0, busbw, busbw)]


def test_a_three_ring_is_six_twin_links_each_between_its_two_nodes():
    fabric, facts = ring3()
    probes, skipped = link_probes(fabric, facts)
    assert skipped == []
    assert [(p.cable, p.twin, p.nodes, p.ips) for p in probes] == [
        ("spark-1 port 0 <-> spark-2 port 1", 0, ("spark-1", "spark-2"), ("10.0.0.1", "10.0.0.2")),
        ("spark-1 port 0 <-> spark-2 port 1", 1, ("spark-1", "spark-2"), ("10.0.1.1", "10.0.1.2")),
        ("spark-2 port 0 <-> spark-3 port 1", 0, ("spark-2", "spark-3"), ("10.0.2.2", "10.0.2.3")),
        ("spark-2 port 0 <-> spark-3 port 1", 1, ("spark-2", "spark-3"), ("10.0.3.2", "10.0.3.3")),
        ("spark-1 port 1 <-> spark-3 port 0", 0, ("spark-1", "spark-3"), ("10.0.4.1", "10.0.4.3")),
        ("spark-1 port 1 <-> spark-3 port 0", 1, ("spark-1", "spark-3"), ("10.0.5.1", "10.0.5.3")),
    ]
    last = probes[-1]
    assert link_env(last, "gloo") == {"spark-1": {"GLOO_SOCKET_IFNAME": "enP2p1s0f1np1", "TP_SOCKET_IFNAME": "enP2p1s0f1np1"},
                                      "spark-3": {"GLOO_SOCKET_IFNAME": "enP2p1s0f0np0", "TP_SOCKET_IFNAME": "enP2p1s0f0np0"}}
    assert link_env(last, "nccl") == {"spark-1": {"NCCL_IB_HCA": "roceP2p1s0f1"}, "spark-3": {"NCCL_IB_HCA": "roceP2p1s0f0"}}


def test_a_switch_link_is_measured_against_the_head_and_the_heads_against_the_next_node():
    nodes = ["spark-1", "spark-2", "spark-3"]
    ipv4 = {n: {TWINS[1][t]: f"10.9.{t}.{i}/24" for t in (0, 1)} for i, n in enumerate(nodes, start=1)}
    facts = {n: node(i, {1}, ipv4[n]) for i, n in enumerate(nodes, start=1)}
    links = tuple(Link(End(n, 1, TWINS[1][t]), End(SWITCH, None, f"twin{t}")) for n in nodes for t in (0, 1))
    probes, skipped = link_probes(Fabric(tuple(nodes), links), facts)
    assert skipped == []
    assert [(p.cable, p.twin, p.nodes) for p in probes] == [
        ("spark-1 port 1 <-> switch", 0, ("spark-1", "spark-2")), ("spark-1 port 1 <-> switch", 1, ("spark-1", "spark-2")),
        ("spark-2 port 1 <-> switch", 0, ("spark-1", "spark-2")), ("spark-2 port 1 <-> switch", 1, ("spark-1", "spark-2")),
        ("spark-3 port 1 <-> switch", 0, ("spark-1", "spark-3")), ("spark-3 port 1 <-> switch", 1, ("spark-1", "spark-3"))]
    assert probes[4].ips == ("10.9.0.1", "10.9.0.3")


def test_an_unaddressed_end_is_said_not_measured():
    fabric, facts = ring3()
    bare = dict(facts, **{"spark-3": node(3, {0, 1}, {})})
    probes, skipped = link_probes(fabric, bare)
    assert len(probes) == 2 and len(skipped) == 4
    assert skipped[0] == ("spark-2 port 0 <-> spark-3 port 1 twin 0: spark-3 enp1s0f1np1 has no IPv4 address "
                          "(run `sparkcluster bootstrap`)")


def test_every_link_holding_is_no_finding_and_the_matrix_shows_each_cable():
    healthy = measured([1.2, 1.1, 1.3, 1.0, 1.2, 1.1])
    assert judge_links(healthy, None) is None
    assert judge_links([LinkMeasure(m.probe, 11.8) for m in healthy], 9.0) is None
    assert matrix(healthy) == [
        "LINK                                     TWIN 0        TWIN 1  (busbw alone, GB/s)",
        "spark-1 port 0 <-> spark-2 port 1         1.200         1.100",
        "spark-2 port 0 <-> spark-3 port 1         1.300         1.000",
        "spark-1 port 1 <-> spark-3 port 0         1.200         1.100",
    ]


def test_a_degraded_link_of_the_ring_is_named_by_the_relative_rule():
    verdict = judge_links(measured([1.2, 1.1, 1.3, 0.1, 1.2, 1.1]), None)
    assert verdict is not None and verdict.status == "FAIL"
    assert verdict.cause == ("link spark-2 port 0 <-> spark-3 port 1 twin 1 (enP2p1s0f0np0) is degraded: 0.100 GB/s "
                             "alone against a median of 1.150 over 6 links (more than 2x under it; fastest 1.300 on "
                             "spark-2 port 0 <-> spark-3 port 1 twin 0 (enp1s0f0np0))")
    assert "spark-2 enP2p1s0f0np0, spark-3 enP2p1s0f1np1" in verdict.fix
    assert len(verdict.details) == 6


def test_one_fast_run_does_not_make_an_ordinary_link_degraded():
    """The simulated 8-node switch on a loaded machine: links spread 0.39-0.80 GB/s, none degraded."""
    spread = measured([0.80, 0.55, 0.60, 0.39, 0.52, 0.58])
    assert judge_links(spread, None) is None
    assert judge_links(measured([0.80, 0.55, 0.60, 0.25, 0.52, 0.58]), None) is not None


def test_a_dead_link_and_a_slow_one_on_real_sparks():
    dead = judge_links(measured([1.2, 1.1, 1.3, 1.0, None, 1.1]), None)
    assert dead is not None and dead.cause == ("link spark-1 port 1 <-> spark-3 port 0 twin 0 (enp1s0f1np1) carries "
                                               "nothing on its own: the probe failed on spark-3 (exit 1)")
    # On GPUs every link is held to the one-twin floor: all equally slow is still slow.
    slow = judge_links([LinkMeasure(m.probe, 6.0) for m in measured([1.0] * 6)], 9.0)
    assert slow is not None and slow.cause.startswith("link spark-1 port 0 <-> spark-2 port 1 twin 0 (enp1s0f0np0) is "
                                                      "slow: 6.00 GB/s alone, under the 9 GB/s one twin delivers")


def test_measure_links_runs_one_after_another_and_keeps_a_failure_as_data():
    fabric, facts = ring3()
    probes, _ = link_probes(fabric, facts)
    order, said = [], []

    def run(probe):
        order.append(probe.nodes)
        if probe.twin == 1:
            raise SparkclusterError("the probe failed on spark-2 (exit 1):\nTraceback", "fix")
        return rows(1.5)

    out = measure_links(probes[:2], run, said.append)
    assert order == [("spark-1", "spark-2")] * 2
    assert [(m.busbw_gbps, m.error) for m in out] == [(1.5, ""), (None, "the probe failed on spark-2 (exit 1):")]
    assert said == ["link 1/2: spark-1 port 0 <-> spark-2 port 1 twin 0 (enp1s0f0np0)",
                    "link 2/2: spark-1 port 0 <-> spark-2 port 1 twin 1 (enP2p1s0f0np0)"]


def test_a_slow_reading_is_measured_again_before_it_is_blamed():
    """A run that landed beside a burst of other work reads slow once; a degraded link reads slow every time. Only
    the suspect is run again, and the better of its two readings is judged."""
    def judge(ms):
        return judge_links(ms, None)

    once = measured([1.2, 1.1, 1.3, 0.4, 1.2, 1.1])
    again: list[object] = []

    def rerun(fast: float):
        def run(m: LinkMeasure) -> list[BandwidthRow]:
            again.append(m.probe.label)
            return rows(fast)
        return run

    cleared, verdict = judged_twice(once, judge, rerun(1.15))
    assert verdict is None and again == [once[3].probe.label] and cleared[3].busbw_gbps == 1.15
    assert [m.busbw_gbps for m in cleared[:3]] == [1.2, 1.1, 1.3]
    again.clear()
    still, verdict = judged_twice(once, judge, rerun(0.3))  # slower the second time: the first reading stands
    assert verdict is not None and "is degraded: 0.400 GB/s" in verdict.cause and still[3].busbw_gbps == 0.4
    assert again == [once[3].probe.label]
    again.clear()
    healthy = measured([1.2, 1.1, 1.3, 1.0, 1.2, 1.1])
    assert judged_twice(healthy, judge, rerun(9.9)) == (healthy, None) and again == []
    dead = measured([1.2, 1.1, 1.3, 1.0, None, 1.1])  # one that carried nothing is blamed at once
    assert judged_twice(dead, judge, rerun(9.9))[1] is not None and again == []
