"""The supervisor's judgement as data: rounds of checks in, verdicts and permissions out, time given."""

from __future__ import annotations

from sparkcluster.serving.incidents import Seen
from sparkcluster.supervise.policy import Check, Judge, Policy, ProbeResult

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


def test_restarts_back_off_and_the_breaker_opens_after_the_limit_within_an_hour():
    judge = Judge(POLICY)
    assert judge.may_restart(0) == (True, None)
    judge.restarting(0)
    assert judge.may_restart(30) == (False, None)  # backing off 60 s before the second
    assert judge.may_restart(60) == (True, None)
    judge.restarting(60)
    assert judge.may_restart(300) == (False, None)  # 300 s before the third
    assert judge.may_restart(360) == (True, None)
    judge.restarting(360)
    allowed, why = judge.may_restart(1000)
    assert not allowed and why == "3 restarts within the last hour (the limit is 3)"
    assert judge.may_restart(3600 + 30)[0]  # an hour after the first restart, one is allowed again
    assert judge.restarts_last_hour(3600 + 30) == 2


def test_the_worst_detection_time_of_the_default_policy_is_under_two_minutes():
    assert Policy().worst_detection_s() <= 120
