"""`sparkcluster verify`: run the bandwidth probe with one rank per node, in the environment vLLM gets (the
node's comm env from bootstrap), and judge which network really carried the traffic.

With NCCL (GPUs), the verdict reads NCCL's own INFO lines: NET/IB on the QSFP's RDMA devices, or a fallback.
With gloo (CPU only, e.g. the simulated cluster), there are no NCCL lines; the verdict then rests on the
TCP connections each rank really used: their addresses name the interface that carried the data.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import resources
from typing import Any

from ..engine.command import Command, shell_path
from ..engine.errors import SparkclusterError
from ..engine.facts import HostFacts
from ..engine.inventory import Host
from ..engine.remote import python_line, python_of, source_env
from ..engine.session import Session
from ..engine.transport import Transport, Unreachable, remote_path
from ..node.addressing import routed_control_plane
from ..node.discovery import fabric_of
from ..node.fabric import Fabric, Kind
from ..node.linkstate import nodes_with_links_down
from ..node.network import COMM_ENV_PATH, QsfpChoice, choose_for, comm_env_path, control_address
from . import controlplane
from .binding import Misbinding, misbindings, parse_env
from .controlplane import ControlAddress
from .lastlog import keep_log
from .latency import SIM_SLOW_RATIO, SLOW_RATIO, Latency, Timed, over_field, read_latency, slow_link_twice, with_latency
from .links import (
    LinkMeasure,
    LinkProbe,
    Measured,
    judge_links,
    link_env,
    link_probes,
    measure_links,
    named_degraded,
)
from .logs import BandwidthRow, read_log, read_probe_output
from .rings import Endpoint
from .thresholds import TWIN, floor_for
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
from .verdict import Verdict, VerdictStatus, judge

MASTER_PORT = 29577
RENDEZVOUS_TIMEOUT_S = 60  # ranks give up waiting for each other after this: a failed rank must not hang the rest
GLOO_SIZES = "1M,4M,16M"  # gloo runs on the CPU: smaller sizes keep a run to seconds
GLOO_RING_SIZES = "1M,4M"
# Each link alone: only the largest size is judged (best_at_largest), so one size keeps a ring's six runs short.
GLOO_LINK_SIZES = "8M"
NCCL_LINK_SIZES = "256M"


@dataclass
class VerifyResult:
    backend: str
    verdict: Verdict
    rows: list[BandwidthRow]
    carried_by: dict[str, list[str]] = field(default_factory=dict)  # node -> "iface local -> remote" lines
    twins: dict[str, float | None] = field(default_factory=dict)  # twin label -> busbw alone (None: carried nothing)
    links: list[LinkMeasure] = field(default_factory=list)  # every twin link of the fabric, measured alone
    control_plane: list[ControlAddress] = field(default_factory=list)  # what each node advertises, judged
    topology: str | None = None  # the fabric graph's kind, as discovery found it
    skipped_links: list[str] = field(default_factory=list)  # links that could not be measured, and why
    latency: Latency | None = None  # the whole group's, per call at decode sizes (each link's: LinkMeasure.latency)


def interface_of(facts: HostFacts, ip: str) -> str | None:
    return next((i.name for i in facts.interfaces if i.has_ip(ip)), None)


def _network_of(facts: HostFacts, ip: str) -> str | None:
    """The interface whose subnet holds `ip` (for a peer's address seen from this node)."""
    address = ipaddress.ip_address(ip)
    return next((i.name for i in facts.interfaces for a in i.ipv4
                 if address.version == a.network.version and address in a.network), None)


TORCH_CHECK = "import torch; print(torch.cuda.is_available())"


def detect_backend(transport: Transport, check_line: str) -> str:
    result = transport.run(Command(check_line, timeout=120))
    if not result.ok:
        raise SparkclusterError(f"PyTorch is not usable on the head ({check_line}): {result.stderr_tail(2)}",
                                "install torch there, or set `python:` in the inventory to an interpreter that has it; "
                                "`serve --no-verify` skips the probe")
    return "nccl" if result.stdout.strip() == "True" else "gloo"


RunInEnv = Callable[[list[str]], Command]  # per node: the command that runs argv where vLLM will run


LAST_VERIFY_PATH = "~/.config/sparkcluster/last-verify.json"  # on every node: what `status` shows


def run_verify(session: Session, *, backend: str = "auto", sizes: str | None = None, min_busbw: float | None = None,
               timeout: float = 600, in_serving_env: Mapping[str, RunInEnv] | None = None,
               per_twin: bool = False) -> VerifyResult:
    """The verdict, also recorded on every node (LAST_VERIFY_PATH) for `status`."""
    result = _run_verify(session, backend, sizes, min_busbw, timeout, in_serving_env, per_twin)
    record_verdict(session, result)
    return result


def record_doc(result: VerifyResult) -> dict[str, Any]:
    """What every node keeps of a verify (LAST_VERIFY_PATH): `status` shows it, doctor's baselines read each link's
    busbw, and bench's decode budget `latency_us` (message bytes -> all_reduce's median microseconds)."""
    largest = max((r.size_bytes for r in result.rows), default=0)
    best = max((r.best_busbw_gbps for r in result.rows if r.size_bytes == largest), default=None)
    return {"status": str(result.verdict.status), "cause": result.verdict.cause, "backend": result.backend,
            "busbw_gbps": best, "size_bytes": largest or None, "twins": result.twins,
            "links": {m.probe.label: m.busbw_gbps for m in result.links},  # each alone, for baselines
            **(result.latency or Latency(())).to_json(),
            "links_latency_us": {m.probe.label: m.latency.to_json()["latency_us"] for m in result.links if m.latency},
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def record_verdict(session: Session, result: VerifyResult) -> None:
    """Best effort: a node that cannot take the record keeps the verdict it had; the verdict is printed anyway."""
    doc = json.dumps(record_doc(result))
    target = shell_path(LAST_VERIFY_PATH)
    command = Command(f"mkdir -p {shell_path(LAST_VERIFY_PATH.rsplit('/', 1)[0])} && cat > {target}.tmp && "
                      f"mv {target}.tmp {target}", stdin=doc, timeout=30)

    def record(host: Host) -> bool:
        try:
            return session.run(host, command).ok
        except Unreachable:  # it dropped off after the measurement: the verdict stands, its record waits
            return False

    session.each(record)


LAST_VERIFY_COMMAND = Command(f"cat {shell_path(LAST_VERIFY_PATH)} 2>/dev/null", timeout=30)


def last_verify(text: str) -> str | None:
    """The record a node keeps as one line for `status`: "PASS, busbw 21.40 GB/s (gloo, 2026-11-24T05:01:02+00:00)";
    None when the node never verified (or the record is not ours)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
        return None
    busbw = doc.get("busbw_gbps")
    measured = f", busbw {busbw:.2f} GB/s" if isinstance(busbw, (int, float)) else ""
    cause = "" if doc["status"] == "PASS" else f": {doc.get('cause', '')}"
    return f"{doc['status']}{measured} ({doc.get('backend', '?')}, {doc.get('at', '?')}){cause}"


def _run_verify(session: Session, backend: str, sizes: str | None, min_busbw: float | None, timeout: float,
                in_serving_env: Mapping[str, RunInEnv] | None, per_twin: bool) -> VerifyResult:
    """`in_serving_env`: per node, the command that runs argv where vLLM will run (serve passes its
    runtime's, e.g. inside the vllm_node container); the probe then travels on stdin. Without it, the probe
    runs on the node with the inventory's `python` and the comm env file."""
    head = session.head
    choices = {h.name: choose_for(h, session.facts[h.name]) for h in session.hosts}  # a QsfpError names the fix
    if backend == "auto":
        check = python_line(python_of(head), TORCH_CHECK)
        if in_serving_env is not None:
            check = in_serving_env[head.name](["python3", "-c", TORCH_CHECK]).script
        backend = detect_backend(session.transport(head), check)
    env_files = _check_comm_env(session)
    fabric = _fabric(session)
    topology = fabric.kind.value if fabric is not None else None
    ring = fabric is not None and fabric.kind is Kind.RING
    master = _rendezvous(session, choices, ring)
    bound, control = check_bindings(session, choices, env_files, in_serving_env, ring=ring, rendezvous=master)
    if bound is not None and any(a.problem for a in control):
        # A control-plane address some node cannot reach: the probe's ranks would wait on it until the timeout.
        return VerifyResult(backend, bound, [], topology=topology, control_plane=control)
    # The probe travels with sparkcluster, in the command itself: nothing to install on the nodes but torch.
    script = (resources.files("sparkcluster.nccl") / "probe.py").read_text()
    # gloo on a ring runs the whole collective on the control plane (the LAN): small sizes, the links get their own
    gloo_sizes = GLOO_RING_SIZES if ring else GLOO_SIZES
    commands = probe_commands(session, master, backend, sizes or (gloo_sizes if backend == "gloo" else None),
                              env_files, script, timeout, in_serving_env)
    try:
        outputs = run_probe(session, commands)
    except SparkclusterError:
        if bound is None:
            raise
        return VerifyResult(backend, bound, [], topology=topology, control_plane=control)
    control_netdevs = {a.interface for a in control if a.interface and not a.problem} if ring else set()
    result = replace(judge_probe(session, backend, outputs, choices, min_busbw, topology, control_netdevs),
                     topology=topology, control_plane=control)
    if per_twin and len(session.hosts) > 1:
        # Two nodes on a switch are a pair here: each node's link against the other is one of the two twin runs.
        if fabric is not None and (fabric.kind is Kind.RING or (fabric.kind is Kind.SWITCH and len(session.hosts) > 2)):
            result = _with_links(session, result, fabric, env_files, script, timeout, in_serving_env)
        else:
            result = _with_twins(session, result, choices, env_files, script, timeout, in_serving_env, fabric)
    if bound is None:
        return result
    # Whatever this run's traffic showed: another connect order, or a third node, uses the misbound env.
    return replace(result, verdict=replace(bound, details=(*bound.details, *result.verdict.details)))


def _check_comm_env(session: Session) -> dict[str, str]:
    """Each node's comm env file (bootstrap wrote it; its path may be set in the inventory, comm_env_path)."""
    env_files = {h.name: remote_path(comm_env_path(h)) for h in session.hosts}
    missing = [h.name for h in session.hosts
               if not session.run(h, Command(f"test -f {shlex.quote(env_files[h.name])}")).ok]
    if missing:
        raise SparkclusterError(f"no comm env ({COMM_ENV_PATH}) on {', '.join(missing)}: the probe must run in the "
                                "environment vLLM gets", "run `sparkcluster bootstrap` first")
    return env_files


def _fabric(session: Session) -> Fabric | None:
    """The cabling as discovery finds it; None where it cannot tell (verify then measures the cabled port's twins,
    as for a pair)."""
    try:
        return fabric_of(session)
    except (SparkclusterError, Unreachable):
        return None


def _with_links(session: Session, result: VerifyResult, fabric: Fabric, env_files: Mapping[str, str], script: str,
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


def _with_twins(session: Session, result: VerifyResult, choices: Mapping[str, QsfpChoice], env_files: Mapping[str, str],
                script: str, timeout: float, in_serving_env: Mapping[str, RunInEnv] | None,
                fabric: Fabric | None = None) -> VerifyResult:
    """The probe again over each twin alone; a dead or degraded twin outranks anything but a FAIL."""
    backend = result.backend
    head = session.head.name
    readings: dict[str, list[Latency]] = {}  # by twin label, one per run

    def run(twin: Twin) -> list[BandwidthRow]:
        sizes = GLOO_TWIN_SIZES if backend == "gloo" else NCCL_TWIN_SIZES
        commands = probe_commands(session, twin.ips[head], backend, sizes, env_files, script, timeout, in_serving_env,
                                  extra_env=twin_env(twin, backend), port=MASTER_PORT + 1 + twin.index)
        output = "\n".join(run_probe(session, commands).values())
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


def _rendezvous(session: Session, choices: Mapping[str, QsfpChoice], ring: bool) -> str:
    """Where the probe's ranks meet: the head's QSFP address on a pair or a switch; on a ring, where a link's
    address reaches one neighbour only, the head's control-plane address (its routed node address, or with
    fabric.control_plane: lan its inventory address: what bootstrap binds the control plane to there)."""
    head = session.head
    if ring:
        return control_address(head, session.facts[head.name], routed_control_plane(session.inventory, head))
    return choices[head.name].ip


def check_bindings(session: Session, choices: Mapping[str, QsfpChoice], env_files: Mapping[str, str],
                   in_serving_env: Mapping[str, RunInEnv] | None, *, ring: bool = False, rendezvous: str | None = None
                   ) -> tuple[Verdict | None, list[ControlAddress]]:
    """FAIL naming the node, variable and value when any node's serving env binds a comm library off the QSFP
    link (on a pair or a switch), or advertises a control-plane address some node cannot reach; None when every
    binding holds. Also every control-plane address each node advertises, judged (controlplane.py)."""
    fabric = [a.network for h in session.hosts for i in session.facts[h.name].interfaces
              if i.name in {choices[h.name].netdev, *choices[h.name].twins} for a in i.ipv4]
    head = session.head.name
    envs: dict[str, dict[str, str]] = {}

    def read(host: Host) -> tuple[str, list[Misbinding]]:
        if in_serving_env is not None:
            command = in_serving_env[host.name](["env"])
        else:
            command = Command(f"cd; {source_env(env_files[host.name])}; env", timeout=60)
        result = session.run(host, command)
        if not result.ok:
            raise SparkclusterError(f"cannot read the serving env on {host.name}: {result.stderr_tail(2)}",
                                    "run `sparkcluster bootstrap` first")
        env = envs[host.name] = parse_env(result.stdout)
        # A ring's control plane is the management LAN (a link's subnet reaches one neighbour): the reachability
        # rule below judges it; on a pair or a switch everything binds to the QSFP link.
        return host.name, [] if ring else misbindings(host.name, env, choices[host.name], session.facts[host.name],
                                                      fabric)

    found = [m for _, ms in session.each(read) for m in ms]
    advertised = [a for h in session.hosts for a in controlplane.advertised(h.name, envs[h.name],
                                                                             session.facts[h.name], head)]
    if rendezvous:
        advertised.append(ControlAddress(head, "verify's rendezvous (the probe's MASTER_ADDR)", rendezvous, head))
    # Addresses off a node's subnets (a ring's routed node addresses) count as reached once that node pings them.
    pending = controlplane.to_reach(advertised, session.facts)
    reached = dict(session.each(lambda host: (host.name, session.run(
        host, controlplane.reach_command(pending[host.name])).stdout.split()),
        [h for h in session.hosts if pending.get(h.name)])) if pending else {}
    control = controlplane.judge(advertised, session.facts, reached)
    unreachable = [a for a in control if a.problem]
    if not found and unreachable:
        bad = unreachable[0]
        return Verdict(VerdictStatus.FAIL, f"{bad.node} advertises a control-plane address some node cannot use: "
                                           f"{bad}", controlplane.fix(bad), tuple(str(a) for a in unreachable), (),
                       False), control
    if not found:
        return None, control
    first = found[0]
    return Verdict(VerdictStatus.FAIL, f"{first.node} binds off the QSFP link: {first.variable}={first.value} "
                                       f"{first.why}",
                   f"bind every comm variable of {first.node} to its QSFP interface ({choices[first.node].netdev}, "
                   f"{choices[first.node].ip}): re-run `sparkcluster bootstrap` (it rewrites {COMM_ENV_PATH}), and "
                   "remove any override from the container's or the shell's environment", tuple(str(m) for m in found), (),
                   False), control


def probe_commands(session: Session, master: str, backend: str, sizes: str | None, env_files: Mapping[str, str],
                   script: str, timeout: float, in_serving_env: Mapping[str, RunInEnv] | None,
                   extra_env: Mapping[str, Mapping[str, str]] | None = None, port: int = MASTER_PORT
                   ) -> dict[str, Command]:
    """Node -> the command that runs its rank of the probe (rank 0 on the head), as a value: nothing runs here."""
    hosts = session.hosts
    commands = {}
    for rank, host in enumerate(hosts):
        args = ["--rank", str(rank), "--world", str(len(hosts)), "--master-addr", master,
                "--master-port", str(port), "--backend", backend, "--timeout", str(RENDEZVOUS_TIMEOUT_S)]
        if sizes:
            args += ["--sizes", sizes]
        extra = dict((extra_env or {}).get(host.name, {}))
        if in_serving_env is not None:
            pinned = [f"{k}={v}" for k, v in extra.items()]
            probe = in_serving_env[host.name](["env", "NCCL_DEBUG=INFO", *pinned, "python3", "-", *args])
            commands[host.name] = replace(probe, script=probe.script + " 2>&1", stdin=script, timeout=timeout + 60)
            continue
        exports = "".join(f"{k}={shlex.quote(v)}; export {k}; " for k, v in extra.items())
        line = (f"{source_env(env_files[host.name])}; NCCL_DEBUG=INFO; export NCCL_DEBUG; {exports}"
                f"exec {python_line(python_of(host), script, *args)} 2>&1")
        commands[host.name] = Command(f"cd; {line}", timeout=timeout + 60)
    return commands


def run_probe(session: Session, commands: Mapping[str, Command]) -> dict[str, str]:
    """Every rank at once (they rendezvous with each other); node -> its output. A rank that fails is an error
    naming its node, with the end of its output."""
    def launch(host: Host) -> tuple[str, str]:
        result = session.run(host, commands[host.name])
        keep_log(session.transport(host), result.stdout + result.stderr)  # pass or fail, for doctor --bundle
        if not result.ok:
            down = nodes_with_links_down(session)  # a rendezvous that timed out: name the links, not gloo's trace
            if down:
                raise SparkclusterError(f"the probe failed on {host.name} (exit {result.exit_code}): the fabric is "
                                        "down: " + "; ".join(down),
                                        "bring those links up (check the QSFP cables; `ip -br link` on the node "
                                        "shows their state), then run verify again")
            tail = "\n".join(result.stdout.strip().splitlines()[-8:]) or result.stderr_tail(8)
            raise SparkclusterError(f"the probe failed on {host.name} (exit {result.exit_code}):\n{tail}",
                                    "run `sparkcluster bootstrap` first; check torch on the node and that the "
                                    "nodes reach each other on the fabric")
        return host.name, result.stdout
    return dict(session.each(launch))


def judge_probe(session: Session, backend: str, outputs: Mapping[str, str], choices: Mapping[str, QsfpChoice],
                min_busbw: float | None, topology: str | None = None, control_netdevs: set[str] | None = None
                ) -> VerifyResult:
    """The verdict from the ranks' outputs: NCCL's own log lines on GPUs, the connections each rank held on CPU."""
    text = "\n".join(outputs.values())
    rows, ranks = read_probe_output(text)
    latency = read_latency(text)
    carried = _carried_by(ranks, session.hosts, session.facts)
    # Real Sparks: the floor of this topology (thresholds.py); gloo on CPU has no link speed to hold.
    nodes = len(session.hosts)
    threshold = min_busbw if min_busbw is not None else (
        floor_for(topology, nodes).min_busbw_gbps if backend == "nccl" else None)
    if backend == "nccl":
        logs = [r for name, out in outputs.items() for r in read_log(out, name)]
        hcas = tuple(dict.fromkeys(hca for c in choices.values() for hca in c.hcas))
        verdict = judge(logs, expected_hcas=hcas, qsfp_interfaces=tuple({c.netdev for c in choices.values()}),
                        rows=rows, min_busbw_gbps=threshold, endpoints=endpoints(session.facts),
                        topology=topology)
        # Real Sparks have field figures to hold the group's latency to; the simulator's CPU gloo has none.
        verdict = with_latency(verdict, over_field(latency) if latency else None)
    else:
        verdict = _judge_connections(carried, choices, control_netdevs or set())
    return VerifyResult(backend, verdict, rows, carried, latency=latency)


def _carried_by(ranks: list[dict[str, Any]], hosts: Sequence[Host], facts: Mapping[str, HostFacts]
                ) -> dict[str, list[str]]:
    """Per node: the interface and addresses of each TCP connection its rank held to another node."""
    out: dict[str, list[str]] = {}
    names = [h.name for h in hosts]
    for rank in ranks:
        index = rank.get("rank")
        if not isinstance(index, int) or index >= len(names):
            continue
        name = names[index]
        lines = []
        for local, remote in rank.get("tcp", []):
            if local == remote or local.startswith("127.") or remote.startswith("127."):
                continue  # loopback: the rank talking to itself or to the local store
            iface = interface_of(facts[name], local) or _network_of(facts[name], remote) or "?"
            lines.append(f"{iface} {local} -> {remote}")
        out[name] = sorted(set(lines))
    return out


def _judge_connections(carried: Mapping[str, list[str]], choices: Mapping[str, QsfpChoice],
                       control_netdevs: set[str]) -> Verdict:
    """`control_netdevs`: on a ring, gloo binds one interface, the control plane's (every node reaches it): there
    the whole collective runs on it, and each link's own run (links.py) proves the fabric."""
    qsfp = {c.netdev for c in choices.values()} | {t for c in choices.values() for t in c.twins} | control_netdevs
    wrong = {node: [l for l in lines if l.split()[0] not in qsfp] for node, lines in carried.items()}
    wrong = {n: ls for n, ls in wrong.items() if ls}
    details = tuple(f"{n}: {l}" for n, ls in carried.items() for l in ls)
    used = sorted({l.split()[0] for ls in carried.values() for l in ls})
    if not any(carried.values()):
        return Verdict(VerdictStatus.FAIL, "no connection between the ranks was seen", "check that the probe ran on every node",
                       details, (), False)
    if wrong:
        node, lines = next(iter(wrong.items()))
        iface = lines[0].split()[0]
        return Verdict(VerdictStatus.FAIL, f"traffic on {iface}, not the QSFP link: {node} {lines[0]}",
                       f"bind every comm variable of {node} to its QSFP interface (re-run `sparkcluster bootstrap`; "
                       f"check GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME in ~/.config/sparkcluster/comm.env)",
                       details, tuple(used), False)
    if set(used) & control_netdevs:
        return Verdict(VerdictStatus.PASS, f"the whole collective ran on the control plane ({', '.join(used)}), which every "
                                           "node reaches (gloo binds one interface); each link of the ring carried its "
                                           "own run", "", details, tuple(used), False)
    return Verdict(VerdictStatus.PASS, f"every connection between the ranks ran over the QSFP interfaces ({', '.join(used)}); "
                           "gloo on CPU checks the binding and path, not RDMA", "", details, tuple(used), False)


def endpoints(facts: Mapping[str, HostFacts]) -> dict[str, Endpoint]:
    """Every address of every node -> its node, netdev and subnet: a failed queue pair's GIDs named as ports."""
    return {str(a.ip): Endpoint(node, i.name, a.network) for node, f in facts.items() for i in f.interfaces
            for a in i.ipv4}
