"""The supervisor's judgement as data: rounds of checks in, verdicts and permissions out, time given."""

from __future__ import annotations

import json

from sparkcluster.serving.incidents import Seen
from sparkcluster.supervise.policy import Check, Judge, Policy, ProbeResult, policy_values

POLICY = Policy(interval_s=15, probe_every_s=30, probe_timeout_s=20, misses=2, backoff_s=(0, 60, 300),
                max_restarts=3, start_timeout_s=600)


def test_a_fault_is_acted_on_at_the_second_miss_in_a_row_with_the_time_since_the_first():
    judge = Judge(POLICY)
    assert judge.judge(Check("vLLM"), 0) is None  # healthy: ready once
    first = judge.judge(Check("vLLM", processes_down=("spark-2",), health=0), 15)
    assert first is not None and first.seen is Seen.ENGINE_DEAD and not first.act
    second = judge.judge(Check("vLLM", processes_down=("spark-2",), health=0), 30)
    assert second is not None and second.act and second.detected_s == 15


def test_a_healthy_round_between_two_misses_starts_the_count_again():
    judge = Judge(POLICY)
    judge.judge(Check("vLLM"), 0)
    assert not judge.judge(Check("vLLM", health=503), 15).act
    assert judge.judge(Check("vLLM"), 30) is None
    again = judge.judge(Check("vLLM", health=503), 45)
    assert again is not None and not again.act


def test_a_loading_engine_is_not_judged_until_its_start_timeout_runs_out():
    """A single-miss policy stopped a model that was still loading (keeping-it-serving.md 1.3): an engine whose
    process runs and that was never ready is loading until the serve's own readiness deadline."""
    judge = Judge(POLICY)
    judge.started("vLLM", 0)
    for t in range(15, 600, 15):
        verdict = judge.judge(Check("vLLM", health=0), t)
        assert verdict is not None and verdict.loading and not verdict.act
    judge.judge(Check("vLLM", health=0), 600)
    late = judge.judge(Check("vLLM", health=0), 615)
    assert late is not None and late.act and not late.loading


def test_a_dead_process_is_never_loading():
    judge = Judge(POLICY)
    judge.started("vLLM", 0)
    judge.judge(Check("vLLM", processes_down=("spark-1",), health=0), 15)
    verdict = judge.judge(Check("vLLM", processes_down=("spark-1",), health=0), 30)
    assert verdict is not None and verdict.act and not verdict.loading


def test_a_refused_key_is_told_once_and_never_counted_as_a_miss():
    """A probe without the key got 401 forever and killed a healthy engine (sparkring#195)."""
    judge = Judge(POLICY)
    judge.judge(Check("vLLM"), 0)
    told = judge.judge(Check("vLLM", probe=ProbeResult.UNAUTHORIZED), 15)
    assert told is not None and told.seen is Seen.UNAUTHORIZED and told.act
    for t in (30, 45, 60):
        again = judge.judge(Check("vLLM", probe=ProbeResult.UNAUTHORIZED), t)
        assert again is not None and not again.act
    assert judge.memory["vLLM"].misses == 0


def test_a_probe_that_times_out_while_health_says_200_is_a_wedge():
    assert Check("vLLM", health=200, probe=ProbeResult.TIMED_OUT).fault() is Seen.WEDGED
    assert Check("vLLM", health=200, stalled=True).fault() is Seen.WEDGED
    assert Check("vLLM", health=200, probe=ProbeResult.OK).fault() is None
    assert Check("vLLM", nodes_down=("spark-2",), health=0).fault() is Seen.NODE_DOWN


def test_restarts_back_off_from_the_end_of_the_last_and_the_breaker_opens_after_the_limit_within_an_hour():
    judge = Judge(POLICY)
    assert judge.may_restart(0) == (True, None)
    judge.restarting(0)
    judge.finished(100, ok=True)  # a restart of 100 s: the backoff counts from its end
    assert judge.may_restart(150) == (False, None)
    assert judge.may_restart(160) == (True, None)
    judge.restarting(160)
    judge.finished(200, ok=True)
    assert judge.may_restart(450) == (False, None)  # 300 s before the third
    assert judge.may_restart(500) == (True, None)
    judge.restarting(500)
    judge.finished(550, ok=True)
    allowed, why = judge.may_restart(1000)
    assert not allowed and why == "3 restarts within the last hour (the limit is 3)"
    assert judge.may_restart(3600 + 30)[0]  # an hour after the first restart, one is allowed again
    assert judge.restarts_last_hour(3600 + 30) == 2


def test_restarts_that_fail_slowly_open_the_breaker_whatever_the_hour():
    """A restart that hangs until the readiness deadline and fails spans the hour: counted per hour, it would
    restart forever (review of issue 48)."""
    judge = Judge(POLICY)
    now = 0.0
    for _ in range(3):
        assert judge.may_restart(now)[0]
        judge.restarting(now)
        now += 1860
        judge.finished(now, ok=False)
        now += 400
    allowed, why = judge.may_restart(now)
    assert not allowed and why == "3 restarts failed in a row (the limit is 3)"


def test_a_restart_a_serve_by_hand_kept_from_happening_is_not_counted():
    judge = Judge(POLICY)
    judge.restarting(0)
    judge.not_counted()
    assert judge.restarts_last_hour(1) == 0 and judge.may_restart(1) == (True, None)


def test_with_the_default_timings_a_wedge_only_the_probe_sees_is_acted_on_within_two_minutes():
    """Rounds every 15 s, a probe every 30 s: a round without a probe neither clears a failed probe nor repeats it
    (review of issue 48: with the count reset between probes, an idle wedge was never acted on)."""
    policy = Policy()
    judge = Judge(policy)
    assert judge.judge(Check("vLLM", probe=ProbeResult.OK), 0) is None
    verdicts = []
    for t in range(15, 150, 15):
        probed = ProbeResult.TIMED_OUT if t % 30 == 0 else None
        verdicts.append((t, judge.judge(Check("vLLM", probe=probed), t)))
    acted = [t for t, v in verdicts if v is not None and v.act]
    assert acted and acted[0] + policy.probe_timeout_s <= policy.worst_detection_s() + 30, verdicts
    assert acted[0] == 60 and verdicts[3][1].seen is Seen.WEDGED


def test_a_probe_that_waits_while_tokens_are_counted_is_a_busy_engine_not_a_wedge():
    assert Check("vLLM", probe=ProbeResult.TIMED_OUT, advancing=True).fault() is None
    assert Check("vLLM", probe=ProbeResult.BUSY).fault() is None  # 429/503: shedding load
    assert Check("vLLM", probe=ProbeResult.FAILED).fault() is Seen.PROBE_FAILED


def test_a_lost_node_waits_its_grace_and_the_supervisors_boot_grace_before_an_action():
    judge = Judge(POLICY, born_at=0)
    gone = Check("vLLM", nodes_down=("spark-2",), health=0)
    assert not judge.judge(gone, 200).act  # one miss
    assert not judge.judge(gone, 215).act  # two misses, but gone only 15 s
    assert judge.judge(gone, 260).act  # gone 60 s
    booting = Judge(POLICY, born_at=1000)  # a supervisor that just started: the node may still be booting
    for t in (1015, 1030, 1100):
        assert not booting.judge(gone, t).act
    assert booting.judge(gone, 1180).act


def test_an_engine_first_seen_wedged_by_a_new_supervisor_is_not_given_the_loading_grace():
    judge = Judge(POLICY)
    judge.judge(Check("vLLM", probe=ProbeResult.TIMED_OUT), 0)
    verdict = judge.judge(Check("vLLM", probe=ProbeResult.TIMED_OUT), 30)
    assert verdict is not None and verdict.act and not verdict.loading


def test_settings_that_are_not_ones_keep_their_defaults_and_are_told():
    values, refused = policy_values({"interval_s": 5, "backoff_s": [], "misses": "two", "max_restarts": 4.0,
                                     "typo_s": 1, "probe_every_s": True})
    assert values == {"interval_s": 5.0, "max_restarts": 4}
    assert refused == ["backoff_s: not a list of seconds", "misses: not a positive number", "typo_s: not a setting",
                       "probe_every_s: not a positive number"]


def test_the_worst_detection_time_of_the_default_policy_is_under_two_minutes():
    assert Policy().worst_detection_s() <= 120


def test_the_breakers_count_outlives_the_supervisor_process_as_wall_clock_times():
    """A supervisor started again by its unit (a crash, a reboot, with a monotonic clock of its own) keeps counting
    the restarts of the last hour and the failures in a row, and its backoff (review of issue 48)."""
    first = Judge(POLICY)
    first.restarting(100)
    first.finished(150, ok=False)
    first.restarting(400)
    first.finished(420, ok=False)
    kept = json.loads(json.dumps(first.breaker_json(now=500, wall=1_000_500)))
    again = Judge(POLICY)
    again.take_breaker(kept, now=7, wall=1_000_600)  # 100 s later, on a clock that began anew
    assert again.restarts_last_hour(7) == 2 and again.failed_in_row == 2
    assert again.may_restart(7) == (False, None)  # 300 s of backoff since the last end, 180 s ago
    assert again.may_restart(7 + 120) == (True, None)
    again.take_breaker({"restarts": "garbage", "failed_in_row": -1}, now=0, wall=0)
    assert again.failed_in_row == 2  # what cannot be read changes nothing
