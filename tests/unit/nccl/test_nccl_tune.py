"""verify --tune's values (issue 50): the candidates and what is never forced, the decode sizes, a trial read from
the probe's own output, the choice (sum checked, busbw held, noise), and the comm env's tuned block."""

from __future__ import annotations

import json

import pytest

from sparkcluster.nccl.tune import (
    BLOCK_BEGIN,
    BLOCK_END,
    DEFAULT,
    Candidate,
    RefusedSetting,
    Trial,
    candidates,
    choose,
    decode_sizes,
    refuse_unsafe,
    trial_of,
    tuned_settings,
    with_tuning,
    without_tuning,
)

LL = Candidate("LL protocol", (("NCCL_PROTO", "LL"),))
SIMPLE = Candidate("Simple protocol", (("NCCL_PROTO", "Simple"),))
FOUR = Candidate("4 channels", (("NCCL_MAX_NCHANNELS", "4"), ("NCCL_MIN_NCHANNELS", "4")))
DECODE = decode_sizes(4096, [1, 8])  # Llama-3-8B's hidden size, bf16: 8 KiB at c1, 64 KiB at c8
BIG = {64 << 20: 20.0, 256 << 20: 21.0}


def trial(c: Candidate, us8k: float, us64k: float, busbw: dict[int, float] = BIG, ok: bool = True) -> Trial:
    return Trial(c, {8192: us8k, 65536: us64k}, busbw, ok)


def test_candidates_start_with_the_default_never_force_ll128_and_fit_the_transport_and_the_comm_env():
    socket = candidates("socket", {})
    assert socket[0] == DEFAULT and all("LL128" not in dict(c.env).get("NCCL_PROTO", "") for c in socket)
    assert any("NCCL_NSOCKS_PERTHREAD" in c.settings for c in socket)
    assert not any("NCCL_IB_QPS_PER_CONNECTION" in c.settings for c in socket)
    assert any("NCCL_IB_QPS_PER_CONNECTION" in c.settings for c in candidates("ib", {}))
    ring = candidates("ib", {"NCCL_ALGO": "Ring", "NCCL_IB_HCA": "rocep1s0f1"})  # bootstrap's ring requirement
    assert not any("NCCL_ALGO" in c.settings for c in ring) and len(ring) == len(candidates("ib", {})) - 6  # 4 pairs


def test_a_forced_ll128_is_refused_with_the_reason_and_ll_is_not():
    for value in ("LL128", "ll128", "LL,LL128"):
        with pytest.raises(RefusedSetting, match="can corrupt data silently"):
            refuse_unsafe({"NCCL_PROTO": value})
    refuse_unsafe({"NCCL_PROTO": "LL"})
    refuse_unsafe({"NCCL_PROTO": "^LL128"})  # NCCL's syntax for "anything but LL128"


def test_decode_sizes_are_hidden_size_times_concurrency_times_dtype_bytes():
    assert DECODE == {1: 8192, 8: 65536}
    assert decode_sizes(8192, [8, 1, 8], dtype_bytes=4) == {1: 32768, 8: 262144}
    with pytest.raises(ValueError):
        decode_sizes(4096, [0])


def test_the_fastest_safe_candidate_within_busbw_is_chosen_and_every_candidate_is_shown_against_the_default():
    trials = [trial(DEFAULT, 50.0, 100.0), trial(LL, 40.0, 85.0),
              trial(FOUR, 30.0, 60.0, {64 << 20: 15.0, 256 << 20: 21.0}),  # fastest, loses 25% busbw at 64 MiB
              trial(SIMPLE, 10.0, 20.0, ok=False)]  # fastest of all, but its sum was wrong
    found = choose(trials, DECODE)
    assert found.chosen == LL and found.changes_anything
    assert found.reason == ("LL protocol: decode all-reduces 150.0 -> 125.0 us (17% faster) within 10% of the "
                            "default's busbw")
    verdicts = {line.name: line.verdict for line in found.lines}
    assert verdicts == {"default": "the default", "LL protocol": "chosen",
                        "4 channels": "loses 25% busbw at 64 MiB and above",
                        "Simple protocol": "wrong sum: refused, its time not counted"}
    assert [round(line.change or 0, 3) for line in found.lines] == [0.0, 0.167, 0.4, 0.8]


def test_nothing_beyond_noise_keeps_the_default_and_says_so():
    found = choose([trial(DEFAULT, 50.0, 100.0), trial(LL, 48.0, 97.0), trial(SIMPLE, 55.0, 120.0)], DECODE)
    assert found.chosen == DEFAULT and not found.changes_anything
    assert found.reason.startswith("no candidate beats the default's decode all-reduce time by more than 5%")
    assert [line.verdict for line in found.lines] == ["the default", "no faster beyond noise", "slower"]


def test_under_gloo_the_default_stays_whatever_the_spread():
    found = choose([trial(DEFAULT, 500.0, 900.0), trial(LL, 300.0, 600.0)], DECODE, backend="gloo")
    assert found.chosen == DEFAULT and "NCCL's settings change nothing" in found.reason


def test_the_least_summed_decode_time_wins_where_no_single_setting_wins_every_size():
    # The shape: LL wins small messages and loses large ones; Simple the other way round.
    found = choose([trial(DEFAULT, 50.0, 100.0), trial(LL, 30.0, 110.0), trial(SIMPLE, 52.0, 60.0)], DECODE)
    assert found.chosen == SIMPLE  # a choice per size is put together from the pairs and measured: tunerun


def test_the_default_must_be_measured_with_the_right_sum():
    with pytest.raises(ValueError, match="default"):
        choose([trial(LL, 40.0, 85.0)], DECODE)
    with pytest.raises(ValueError, match="default"):
        choose([trial(DEFAULT, 40.0, 85.0, ok=False)], DECODE)


def probe_output(latency: list[dict], rows: list[dict]) -> str:
    """What the probe prints last (rank 0), behind torchrun's prefix."""
    return "[rank0]: some line\n" + "[default0]:SPARKCLUSTER_PROBE_RESULT " + json.dumps(
        {"backend": "nccl", "world": 2, "rows": rows, "latency": latency})


def test_a_trial_is_read_from_the_probes_output_and_an_unchecked_sum_counts_as_wrong():
    latency = [{"op": "all_reduce", "size_bytes": 8192, "median_us": 41.5, "p99_us": 60.0, "iters": 100,
                "sum_ok": True},
               {"op": "all_gather", "size_bytes": 8192, "median_us": 30.0, "p99_us": 40.0, "iters": 100}]
    rows = [{"op": "all_reduce", "size_bytes": 64 << 20, "time_us": 3000.0, "algbw_gbps": 22.4,
             "busbw_gbps": 22.4}]
    found = trial_of(LL, probe_output(latency, rows))
    assert found == Trial(LL, {8192: 41.5}, {64 << 20: 22.4}, True)
    del latency[0]["sum_ok"]  # an older probe, which checks no sum
    unchecked = trial_of(LL, probe_output(latency, rows))
    assert unchecked is not None and not unchecked.sum_ok
    assert trial_of(LL, "no result here") is None


COMM_ENV = "# written by sparkcluster bootstrap\nNCCL_IB_HCA=rocep1s0f1\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n"


def test_the_tuned_block_is_added_replaced_read_back_and_removed_leaving_the_rest_alone():
    chosen = choose([trial(DEFAULT, 50.0, 100.0), trial(LL, 40.0, 85.0)], DECODE)
    tuned = with_tuning(COMM_ENV, chosen, "2026-12-01T21:40:00+00:00")
    assert tuned.startswith(COMM_ENV) and BLOCK_BEGIN in tuned and tuned.endswith(BLOCK_END + "\n")
    assert "NCCL_PROTO=LL\n" in tuned and tuned_settings(tuned) == {"NCCL_PROTO": "LL"}
    again = with_tuning(tuned, choose([trial(DEFAULT, 50.0, 100.0), trial(FOUR, 30.0, 60.0)], DECODE), "later")
    assert again.count(BLOCK_BEGIN) == 1 and tuned_settings(again) == FOUR.settings
    assert without_tuning(again) == COMM_ENV and tuned_settings(COMM_ENV) == {}
    kept = choose([trial(DEFAULT, 50.0, 100.0), trial(LL, 49.0, 99.0)], DECODE)
    assert with_tuning(tuned, kept, "now") == COMM_ENV  # the default wins: no block at all
    ll128 = Candidate("LL128", (("NCCL_PROTO", "LL128"),))
    forced = choose([trial(DEFAULT, 50.0, 100.0), trial(ll128, 9.0, 9.0)], DECODE)  # fastest, and never forced
    assert forced.chosen == DEFAULT and forced.lines[1].verdict.startswith("never forced")
    with pytest.raises(RefusedSetting):  # nor written, whatever asks
        with_tuning(COMM_ENV, type(forced)(ll128, "asked", (), 1.0, 1.0), "now")


def test_on_a_real_capture_the_candidates_are_judged_and_nothing_beats_the_defaults_own_spread():
    """tests/device/tune_candidates.py on one H200, two ranks each its own host over sockets (under CUDA MPS): the
    default ran first and last, 9-candidate figures in between (NCCL_ALGO=Tree gave no result there)."""
    from pathlib import Path

    from sparkcluster.nccl.tune import noise_of

    log = Path(__file__).resolve().parents[2] / "fixtures" / "nccl" / "real" / "h200-one-gpu-tune-candidates.log"
    docs = [json.loads(line.removeprefix("TUNE_TRIAL ")) for line in log.read_text().splitlines()
            if line.startswith("TUNE_TRIAL ")]
    trials = [Trial(DEFAULT if d["name"] == "default" else Candidate(d["name"], tuple(sorted(d["env"].items()))),
                    {int(k): v for k, v in d["latency_us"].items()}, {int(k): v for k, v in d["busbw_gbps"].items()},
                    d["sum_ok"]) for d in docs]
    first, last = trials[0], trials[-1]
    assert first.candidate == last.candidate == DEFAULT and all(t.sum_ok for t in trials)
    noise = noise_of(first, last, DECODE)
    assert noise == pytest.approx((233.3 - 214.4) / 214.4, abs=0.002)  # the default moved 9% between its runs
    found = choose(trials[:-1], DECODE, noise=noise)
    assert found.chosen == DEFAULT and "by more than 9%" in found.reason
    verdicts = {line.name: line.verdict for line in found.lines}
    assert verdicts["LL protocol"] == "loses 71% busbw at 64 MiB and above"  # 11% faster at decode sizes
    assert verdicts["2 channels"] == "no faster beyond noise" and verdicts["Simple protocol"] == "slower"
    assert "Tree algorithm" not in verdicts
    # With the fixed 5% alone, 2 channels' 4% would still be noise; LL's busbw loss keeps it out either way.
    assert choose(trials[:-1], DECODE).chosen == DEFAULT


def test_bootstraps_rewrite_keeps_the_tuned_block_less_what_bootstrap_now_sets():
    from sparkcluster.nccl.tune import BLOCK_BEGIN, BLOCK_END, keep_tuning, tuned_settings

    old = f"A=1\n{BLOCK_BEGIN}\n# why\nNCCL_PROTO=LL\nNCCL_ALGO=Tree\n{BLOCK_END}\n"
    assert keep_tuning(old, "A=2\n") == f"A=2\n{BLOCK_BEGIN}\n# why\nNCCL_PROTO=LL\nNCCL_ALGO=Tree\n{BLOCK_END}\n"
    ring = keep_tuning(old, "A=2\nNCCL_ALGO=Ring\n")  # bootstrap's requirement wins over the tuning
    assert tuned_settings(ring) == {"NCCL_PROTO": "LL"} and ring.count("NCCL_ALGO") == 1
    assert keep_tuning(f"{BLOCK_BEGIN}\nNCCL_ALGO=Tree\n{BLOCK_END}\n", "NCCL_ALGO=Ring") == "NCCL_ALGO=Ring"
    assert keep_tuning("A=1\n", "A=2\n") == "A=2\n"  # no block: bootstrap's file as rendered
