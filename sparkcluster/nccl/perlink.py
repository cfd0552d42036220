"""Each link alone, after the whole group's run: the probe again between the two nodes at each twin link's ends
(a ring, a switch of three or more) or over each twin of a pair, judged on bandwidth (twice where suspect) and on
latency; a dead or slow link outranks anything but a FAIL of the whole collective."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ..engine.errors import SparkclusterError
from ..engine.facts import HostFacts
from ..engine.session import Session
from ..node.fabric import Fabric, Kind
from ..node.network import QsfpChoice
from .latency import SIM_SLOW_RATIO, SLOW_RATIO, Latency, Timed, read_latency, slow_link_twice, with_latency
from .links import LinkMeasure, LinkProbe, Measured, judge_links, link_env, link_probes, measure_links, named_degraded
from .logs import BandwidthRow, read_probe_output
from .proberun import MASTER_PORT, RunInEnv, probe_commands, run_probe
from .thresholds import TWIN
from .twins import (
    GLOO_TWIN_SIZES,
    NCCL_TWIN_SIZES,
    Twin,
    TwinMeasure,
    judge_twins,
    judged_twice,
    measure,
    twin_env,
    twins_of,
)
from .verdict import VerdictStatus
from .verifyresult import VerifyResult

# Each link alone: only the largest size is judged (best_at_largest), so one size keeps a ring's six runs short.
GLOO_LINK_SIZES = "8M"
NCCL_LINK_SIZES = "256M"


def with_links(session: Session, result: VerifyResult, fabric: Fabric, env_files: Mapping[str, str], script: str,
                timeout: float, in_serving_env: Mapping[str, RunInEnv] | None) -> VerifyResult:
    """Each twin link of a ring or switch alone, between the two nodes at its ends; a dead or slow link outranks
    anything but a FAIL of the whole collective."""
    backend = result.backend
    probes, skipped = link_probes(fabric, session.facts)
    probes = [p for p in probes if all(n in session.facts for n in p.nodes)]

    readings: dict[str, list[Latency]] = {}  # by link label, one per run

    def run(probe: LinkProbe) -> list[BandwidthRow]:
        pair = session.only(probe.nodes)
        sizes = GLOO_LINK_SIZES if backend == "gloo" else NCCL_LINK_SIZES
        commands = probe_commands(pair, probe.ips[0], backend, sizes, env_files, script, timeout, in_serving_env,
                                  extra_env=link_env(probe, backend), port=MASTER_PORT + 3)
        output = "\n".join(run_probe(pair, commands).values())
        _keep(readings, probe.label, read_latency(output))
        return read_probe_output(output)[0]

    floor = TWIN.min_busbw_gbps if backend == "nccl" else None
    measures, verdict = judged_twice(measure_links(probes, run), lambda ms: judge_links(ms, floor),
                                     lambda m: run(m.probe))
    by_label = {p.label: p for p in probes}
    timed, slow = slow_link_twice([Timed(m.probe.label, t, tuple((e.node, e.netdev) for e in m.probe.ends))
                                   for m in measures if (t := _first(readings, m.probe.label))],
                                  _timed_again(lambda label: run(by_label[label]), readings), _slow_ratio(backend))
    judged = {t.label: t.latency for t in timed}
    measures = [replace(m, latency=judged.get(m.probe.label)) for m in measures]
    verdict = named_degraded(verdict, [Measured.of_link(m) for m in measures], session.facts, backend)
    result = replace(result, links=measures, skipped_links=skipped)
    if verdict is None or result.verdict.status is VerdictStatus.FAIL:
        details = (*result.verdict.details, *(verdict.details if verdict else ()), *skipped)
        return replace(result, verdict=with_latency(replace(result.verdict, details=tuple(details)), slow))
    return replace(result, verdict=with_latency(replace(verdict, details=(*verdict.details, *result.verdict.details)),
                                                slow))


def _slow_ratio(backend: str) -> float:
    """How much slower than its peers a link's small messages must be to be named: real Sparks' rule, or the
    simulator's (gloo on shared CPUs, latency.py)."""
    return SLOW_RATIO if backend == "nccl" else SIM_SLOW_RATIO


def _keep(readings: dict[str, list[Latency]], label: str, latency: Latency | None) -> None:
    if latency is not None:
        readings.setdefault(label, []).append(latency)


def _first(readings: Mapping[str, list[Latency]], label: str) -> Latency | None:
    return next(iter(readings.get(label, ())), None)


def _timed_again(run: Callable[[str], object], readings: Mapping[str, list[Latency]]
                 ) -> Callable[[str], Latency | None]:
    """A suspect twin's or link's second reading, by its label: the run the bandwidth rule already made again
    (judged_twice) where it did, else one more run (`run` keeps its reading in `readings`); a run that fails leaves
    the first reading to be judged."""
    def again(label: str) -> Latency | None:
        if len(readings.get(label, ())) < 2:
            try:
                run(label)
            except SparkclusterError:
                return None
        found = readings.get(label, [])
        return found[1] if len(found) >= 2 else None
    return again


def _pair_links(fabric: Fabric | None, facts: Mapping[str, HostFacts], measures: Sequence[TwinMeasure],
                latencies: Mapping[str, Latency | None]) -> list[LinkMeasure]:
    """On a pair (or two nodes on a switch) each twin's run is its link's: the matrix from the twin measures (and
    their latency, by twin label), with no run more."""
    if fabric is None or fabric.kind not in (Kind.PAIR, Kind.SWITCH):
        return []
    probes, _ = link_probes(fabric, facts)
    by_netdevs = {frozenset(m.twin.netdevs.items()): m for m in measures}
    out = []
    for probe in probes:
        found = by_netdevs.get(frozenset((e.node, e.netdev) for e in probe.ends))
        if found is not None:
            out.append(LinkMeasure(probe, found.busbw_gbps, found.error, latencies.get(found.twin.label)))
    return out


# A twin's run may take this many times its sibling's before it is called too slow (at least the minimum): a twin
# delayed 500 ms each way otherwise held verify for the whole --timeout (684 s against 32 s healthy).
TWIN_BUDGET_RATIO = 5.0
TWIN_BUDGET_MIN_S = 60.0


def twin_budget(timeout: float, took: Sequence[float]) -> float:
    """The seconds a twin's run may take: the whole timeout until one twin finished, then a multiple of the
    fastest."""
    return min(timeout, max(TWIN_BUDGET_MIN_S, TWIN_BUDGET_RATIO * min(took))) if took else timeout


def with_twins(session: Session, result: VerifyResult, choices: Mapping[str, QsfpChoice], env_files: Mapping[str, str],
                script: str, timeout: float, in_serving_env: Mapping[str, RunInEnv] | None,
                fabric: Fabric | None = None) -> VerifyResult:
    """The probe again over each twin alone; a dead or degraded twin outranks anything but a FAIL."""
    backend = result.backend
    head = session.head.name
    readings: dict[str, list[Latency]] = {}  # by twin label, one per run
    took: list[float] = []  # seconds, per twin run that finished

    def run(twin: Twin) -> list[BandwidthRow]:
        sizes = GLOO_TWIN_SIZES if backend == "gloo" else NCCL_TWIN_SIZES
        commands = probe_commands(session, twin.ips[head], backend, sizes, env_files, script, twin_budget(timeout, took),
                                  in_serving_env, extra_env=twin_env(twin, backend), port=MASTER_PORT + 1 + twin.index)
        started = time.monotonic()
        output = "\n".join(run_probe(session, commands).values())
        took.append(time.monotonic() - started)
        _keep(readings, twin.label, read_latency(output))
        return read_probe_output(output)[0]

    measures, verdict = judged_twice(measure(twins_of(choices, session.facts), run),
                                     lambda ms: judge_twins(ms, head), lambda m: run(m.twin))
    verdict = named_degraded(verdict, [Measured(m.twin.label, m.busbw_gbps, tuple(m.twin.netdevs.items()))
                                       for m in measures], session.facts, backend)
    twins = {m.twin.label: m.busbw_gbps for m in measures}
    by_label = {m.twin.label: m.twin for m in measures}
    timed, slow = slow_link_twice([Timed(m.twin.label, t, tuple(m.twin.netdevs.items())) for m in measures
                                   if (t := _first(readings, m.twin.label))],
                                  _timed_again(lambda label: run(by_label[label]), readings), _slow_ratio(backend))
    judged = {t.label: t.latency for t in timed}
    result = replace(result, links=_pair_links(fabric, session.facts, measures, judged))
    if verdict is None or result.verdict.status is VerdictStatus.FAIL:
        details = (*result.verdict.details, *(verdict.details if verdict else
                                             (f"{k}: busbw {v:.3f} GB/s alone" for k, v in twins.items() if v)))
        return replace(result, verdict=with_latency(replace(result.verdict, details=tuple(details)), slow),
                       twins=twins)
    return replace(result, verdict=with_latency(replace(verdict, details=(*verdict.details, *result.verdict.details)),
                                                slow), twins=twins)
