"""verify's latency at decode sizes (issue 40): the probe's per-call timing, its output read back, the typed value
in --json and the last-verify record, the field thresholds and the link named when much slower than its peers."""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparkcluster.nccl import cli as nccl_cli
from sparkcluster.nccl import probe
from sparkcluster.nccl.lastverify import record_doc
from sparkcluster.nccl.latency import (
    SIM_SLOW_RATIO,
    Latency,
    LatencyRow,
    Timed,
    at_size,
    over_field,
    read_latency,
    slow_link,
    slow_link_twice,
    summary,
    with_latency,
)
from sparkcluster.nccl.links import latency_matrix
from sparkcluster.nccl.tables import read_tables
from sparkcluster.nccl.thresholds import LATENCY_FIELD
from sparkcluster.nccl.verdict import Verdict, VerdictStatus
from sparkcluster.nccl.verifyresult import VerifyResult
from tests.support.nccl import measured

FIXTURE = Path(__file__).parents[2] / "fixtures" / "nccl" / "captured-gloo-latency.log"
DECODE_SIZES = [8 << 10, 32 << 10, 128 << 10, 512 << 10, 2 << 20]


def latency(medians: dict[int, float], op: str = "all_reduce") -> Latency:
    return Latency(tuple(LatencyRow(op, size, us, 2 * us, 50) for size, us in medians.items()))


def flat(us: float) -> Latency:
    return latency(dict.fromkeys(DECODE_SIZES, us))


def test_the_probe_times_decode_sizes_by_default_and_refuses_bad_ones():
    args = probe.parse_args(["--backend", "gloo"], {})
    assert args.latency_sizes == DECODE_SIZES and args.latency_iters == 50
    assert probe.parse_args([], {}).latency_iters == 100  # a GPU: enough samples for a p99 that is not the worst one
    assert probe.parse_args(["--backend", "gloo", "--latency-sizes", "none"], {}).latency_sizes == []
    with pytest.raises(SystemExit):
        probe.parse_args(["--backend", "gloo", "--latency-sizes", "2G"], {})  # over --max-bytes 1G
    with pytest.raises(SystemExit):
        probe.parse_args(["--backend", "gloo", "--latency-iters", "0"], {})


def test_median_and_nearest_rank_p99_of_each_call():
    seconds = [i / 1e6 for i in range(1, 101)]  # 1..100 us
    assert probe.percentile(seconds, 0.99) == 99 / 1e6  # a time one call took, not an interpolation
    assert probe.latency_row("all_reduce", 8192, seconds) == {"op": "all_reduce", "size_bytes": 8192,
                                                              "median_us": 50.5, "p99_us": 99.0, "iters": 100}
    assert probe.percentile([3e-6], 0.99) == 3e-6


def test_the_probes_latency_is_read_back_from_a_real_run_and_not_taken_for_a_bandwidth_table():
    text = FIXTURE.read_text()
    found = read_latency(text)
    assert found is not None
    assert sorted(found.median_us()) == DECODE_SIZES and sorted(found.median_us("all_gather")) == DECODE_SIZES
    assert found.median_us()[8192] == 335.62 and found.p99_us()[8192] == 3077.86
    assert all(r.calls == 50 for r in found.rows)
    # nccl-report's table reader sees the two bandwidth tables only: the latency block is not a busbw table
    assert [(t.op, [r.size_bytes for r in t.rows]) for t in read_tables(text)] == [("probe", [1 << 20, 1 << 20])]
    assert read_latency("SPARKCLUSTER_PROBE_RESULT {\"rows\": []}") is None  # an older probe: no latency, no guess


def test_latency_us_maps_message_bytes_to_the_median_and_round_trips():
    value = latency({8192: 41.0, 65536: 120.5})
    doc = value.to_json()
    assert doc["latency_us"] == {"8192": 41.0, "65536": 120.5} and doc["latency_p99_us"] == {"8192": 82.0,
                                                                                               "65536": 241.0}
    assert doc["all_gather_latency_us"] == {}
    back = Latency.from_json(json.loads(json.dumps(doc)))
    assert back is not None and back.median_us() == value.median_us() and back.p99_us() == value.p99_us()
    assert Latency.from_json({"status": "PASS"}) is None  # a record written before latency was measured


def test_between_measured_sizes_latency_is_interpolated_on_log_log_axes_and_never_extrapolated():
    field = dict(LATENCY_FIELD)
    assert at_size(field, 8 << 10) == 41.0 and at_size(field, 1 << 20) == 2100.0
    # 32 KiB is 2/3 of the way from 8 KiB to 64 KiB in log2 (13 -> 15 of 13 -> 16): 41 * (127/41)^(2/3) = 87.1
    assert at_size(field, 32 << 10) == pytest.approx(87.12, abs=0.01)
    assert at_size(field, 4 << 10) is None and at_size(field, 2 << 20) is None


def test_a_link_over_twice_its_peers_at_decode_sizes_is_named_with_its_latency_and_likely_causes():
    links = [Timed(f"link {i}", flat(us), (("spark-1", f"enp{i}"), ("spark-2", f"enp{i}")))
             for i, us in enumerate([300.0, 320.0, 310.0, 4300.0])]
    found = slow_link(links)
    assert found is not None and found.status is VerdictStatus.WARN
    assert found.cause == ("link 3 is slow for small messages: all_reduce 4300 us at 32 KiB against 310, 4300 us at "
                           "128 KiB against 310 on its peers (median), 13.9x or more: decode's all-reduces wait on it")
    assert found.fix.startswith("likely causes, at its ends (spark-1 enp3, spark-2 enp3): one twin of the port down")
    assert "too few NCCL channels" in found.fix and "PFC/ECN" in found.fix
    assert "link 0: all_reduce 8 KiB 300/600 us, 32 KiB 300/600 us" in found.details[0]


def test_links_within_twice_each_other_or_slow_at_one_decode_size_only_are_not_named():
    ends = (("spark-1", "a"), ("spark-2", "b"))
    assert slow_link([Timed("a", flat(300.0), ends), Timed("b", flat(590.0), ends)]) is None
    spiky = latency({8 << 10: 300.0, 32 << 10: 2000.0, 128 << 10: 310.0})  # one noisy size is not a slow link
    assert slow_link([Timed("a", flat(300.0), ends), Timed("b", spiky, ends)]) is None
    assert slow_link([Timed("alone", flat(9000.0), ends)]) is None  # nothing to compare with
    assert slow_link([Timed("a", latency({8192: 10.0}), ends), Timed("b", latency({8192: 99.0}), ends)]) is None


def test_real_sparks_group_over_twice_the_field_figure_is_a_warn_with_the_wire_floor():
    healthy = latency({8 << 10: 45.0, 32 << 10: 90.0, 128 << 10: 260.0, 512 << 10: 1100.0, 2 << 20: 4000.0})
    assert over_field(healthy) is None
    slow = latency({8 << 10: 95.0, 32 << 10: 90.0})
    found = over_field(slow)
    assert found is not None and found.status is VerdictStatus.WARN
    assert found.cause == ("all_reduce takes 95 us at 8 KiB, more than 2x the 41 us owners measured on a direct pair "
                           "(the wire's floor: 8.8 us for 48 KiB)")
    assert over_field(latency({2 << 20: 90000.0})) is None  # beyond the field's sizes: shown, not judged


def verdict(status: VerdictStatus, cause: str) -> Verdict:
    return Verdict(status, cause, "the fix", ("detail",), (), False)


def test_a_latency_finding_becomes_the_cause_of_a_pass_and_joins_a_failure_naming_the_same_twin():
    ends = (("spark-1", "enP2p1s0f1np1"), ("spark-2", "enP2p1s0f1np1"))
    slow = slow_link([Timed("twin 0 (enp1s0f1np1)", flat(400.0), ends),
                      Timed("twin 1 (enP2p1s0f1np1)", flat(4400.0), ends)])
    assert slow is not None
    passed = with_latency(verdict(VerdictStatus.PASS, "every connection ran over the QSFP interfaces"), slow)
    assert passed.status is VerdictStatus.WARN and passed.cause == slow.cause and passed.details[-1] == "detail"
    failed = with_latency(verdict(VerdictStatus.FAIL, "twin 1 (enP2p1s0f1np1) is degraded: 0.1 GB/s alone"), slow)
    assert failed.status is VerdictStatus.FAIL
    assert failed.cause == ("twin 1 (enP2p1s0f1np1) is degraded: 0.1 GB/s alone; it is slow for small messages: "
                            "all_reduce 4400 us at 32 KiB "
                            "against 400, 4400 us at 128 KiB against 400 on its peers (median), 11.0x or more: "
                            "decode's all-reduces wait on it")
    assert failed.fix.startswith("the fix; if it stays slow for small messages, likely causes, at its ends")
    other = with_latency(verdict(VerdictStatus.FAIL, "traffic on enP7s7"), slow)
    assert other.cause == "traffic on enP7s7" and f"latency: WARN {slow.cause}" in other.details
    assert with_latency(passed, None) is passed


def test_the_text_shows_latency_beside_busbw_for_the_group_and_each_link():
    assert summary(latency({8192: 41.0, 2 << 20: 2100.4})) == "8 KiB 41/82 us, 2 MiB 2100/4201 us"
    links = [m for m in measured([1.0] * 6)]
    links[0] = type(links[0])(links[0].probe, 1.0, "", flat(300.0))
    links[1] = type(links[1])(links[1].probe, 1.0, "", flat(4300.0))
    assert latency_matrix(links) == [
        "LINK                               TWIN     8 KiB    32 KiB   128 KiB   512 KiB     2 MiB  (all_reduce "
        "median per call, us)",
        "spark-1 port 0 <-> spark-2 port 1     0       300       300       300       300       300",
        "spark-1 port 0 <-> spark-2 port 1     1      4300      4300      4300      4300      4300"]
    assert latency_matrix(measured([1.0])) == []  # no latency timed: no block


def test_json_and_the_last_verify_record_carry_latency_us_for_the_group_and_each_link():
    links = [type(m)(m.probe, 1.0, "", flat(300.0)) for m in measured([1.0, 1.0])]
    result = VerifyResult("gloo", verdict(VerdictStatus.PASS, "ok"), [], links=links, latency=flat(250.0))
    record = record_doc(result)
    assert record["latency_us"] == {str(s): 250.0 for s in DECODE_SIZES}
    assert record["links_latency_us"] == {m.probe.label: {str(s): 300.0 for s in DECODE_SIZES} for m in links}
    assert links[0].to_json()["latency_us"] == {str(s): 300.0 for s in DECODE_SIZES}


@pytest.mark.parametrize(("status", "strict", "code"), [
    (VerdictStatus.WARN, False, 0), (VerdictStatus.WARN, True, 1), (VerdictStatus.PASS, True, 0),
    (VerdictStatus.FAIL, False, 1)])
def test_strict_makes_a_warn_exit_1(monkeypatch, capsys, status, strict, code):
    result = VerifyResult("gloo", verdict(status, "a link is slow for small messages"), [], latency=flat(300.0))
    monkeypatch.setattr(nccl_cli, "run_verify", lambda session, **kwargs: result)

    @contextmanager
    def connect(args, check=None):  # verify hands connect its one-node check (before connecting)
        yield None

    args = argparse.Namespace(backend="auto", sizes=None, min_busbw=None, twins=True, json=True, strict=strict)
    assert nccl_cli.cmd_verify(args, connect) == code
    assert json.loads(capsys.readouterr().out)["latency_us"]["32768"] == 300.0


def test_a_suspect_is_timed_again_before_it_is_named_and_the_faster_reading_kept():
    ends = (("spark-1", "a"), ("spark-2", "a"))
    links = [Timed("a", flat(300.0), ends), Timed("b", flat(900.0), ends)]
    asked: list[str] = []

    def again(label: str) -> Latency:
        asked.append(label)
        return flat(320.0)  # a burst of other work the first time: ordinary now

    judged, found = slow_link_twice(links, again)
    assert asked == ["b"] and found is None and judged[1].latency.median_us()[32 << 10] == 320.0
    still_slow, named = slow_link_twice(links, lambda label: flat(4000.0))
    assert named is not None and named.cause.startswith("b is slow for small messages: all_reduce 900 us at 32 KiB")
    assert still_slow[1].latency.median_us()[32 << 10] == 900.0  # the faster of the two readings
    assert slow_link_twice(links, lambda label: None)[1] is not None  # no second reading: the first is judged
    healthy = [Timed("a", flat(300.0), ends), Timed("b", flat(310.0), ends)]
    assert slow_link_twice(healthy, lambda label: pytest.fail("no suspect, no second run")) == (healthy, None)


def test_the_simulator_names_a_link_only_far_slower_than_its_peers():
    """gloo on shared CPUs: a healthy link's median swings 3x run to run, a twin delayed 2 ms each way is 12-34x."""
    ends = (("spark-1", "a"), ("spark-2", "a"))
    noisy = [Timed("a", flat(500.0), ends), Timed("b", flat(1600.0), ends)]
    assert slow_link(noisy) is not None and slow_link(noisy, SIM_SLOW_RATIO) is None
    delayed = [Timed("a", flat(636.0), ends), Timed("b", flat(14082.0), ends)]
    assert slow_link(delayed, SIM_SLOW_RATIO) is not None


@pytest.mark.parametrize(("capture", "at_8k", "at_2m"), [
    ("h100x2-probe-latency-p2p.log", 9.6, 32.9), ("h100x2-probe-latency-socket.log", 46.34, 773.31)])
def test_the_probes_latency_on_two_h100s_reads_back(capture, at_8k, at_2m):
    """Real NCCL on two H100s of one host (P2P/NVLink, and forced onto sockets over lo): CUDA events around calls
    run back to back, so an 8 KiB all_reduce reads as its GPU time (about 10 us on NVLink), not torch's host work."""
    found = read_latency((FIXTURE.parent / "real" / capture).read_text())
    assert found is not None and sorted(found.median_us()) == DECODE_SIZES
    assert found.median_us()[8192] == at_8k and found.median_us()[2 << 20] == at_2m
    assert all(r.calls == 200 for r in found.rows)
