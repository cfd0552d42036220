"""`sparkcluster verify`: run the bandwidth probe with one rank per node, in the environment vLLM gets (the
node's comm env from bootstrap), and judge which network really carried the traffic.

With NCCL (GPUs), the verdict reads NCCL's own INFO lines: NET/IB on the QSFP's RDMA devices, or a fallback.
With gloo (CPU only, e.g. the simulated cluster), there are no NCCL lines; the verdict then rests on the
TCP connections each rank really used: their addresses name the interface that carried the data.

Here the order of a run; its parts beside it: servingenv (the env each node serves with, checked first), proberun
(the probe's commands), groupverdict (the whole group's run judged), perlink (each link alone), lastverify (the
record every node keeps) and verifyresult (what a run found).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from importlib import resources

from ..engine.errors import SparkclusterError
from ..engine.remote import python_line, python_of
from ..engine.session import Session
from ..engine.transport import Unreachable
from ..node.addressing import routed_control_plane
from ..node.discovery import fabric_of
from ..node.fabric import Fabric, Kind
from ..node.network import QsfpChoice, choose_for, control_address
from .groupverdict import judge_probe
from .lastverify import record_verdict
from .perlink import with_links, with_twins
from .proberun import TORCH_CHECK, RunInEnv, detect_backend, probe_commands, run_probe
from .servingenv import check_bindings, check_comm_env
from .verifyresult import VerifyResult

GLOO_SIZES = "1M,4M,16M"  # gloo runs on the CPU: smaller sizes keep a run to seconds
GLOO_RING_SIZES = "1M,4M"


def run_verify(session: Session, *, backend: str = "auto", sizes: str | None = None, min_busbw: float | None = None,
               timeout: float = 600, in_serving_env: Mapping[str, RunInEnv] | None = None,
               per_twin: bool = False) -> VerifyResult:
    """The verdict, also recorded on every node (LAST_VERIFY_PATH) for `status`."""
    result = _run_verify(session, backend, sizes, min_busbw, timeout, in_serving_env, per_twin)
    record_verdict(session, result)
    return result


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
    env_files = check_comm_env(session)
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
            result = with_links(session, result, fabric, env_files, script, timeout, in_serving_env)
        else:
            result = with_twins(session, result, choices, env_files, script, timeout, in_serving_env, fabric)
    if bound is None:
        return result
    # Whatever this run's traffic showed: another connect order, or a third node, uses the misbound env.
    return replace(result, verdict=replace(bound, details=(*bound.details, *result.verdict.details)))


def _fabric(session: Session) -> Fabric | None:
    """The cabling as discovery finds it; None where it cannot tell (verify then measures the cabled port's twins,
    as for a pair)."""
    try:
        return fabric_of(session)
    except (SparkclusterError, Unreachable):
        return None


def _rendezvous(session: Session, choices: Mapping[str, QsfpChoice], ring: bool) -> str:
    """Where the probe's ranks meet: the head's QSFP address on a pair or a switch; on a ring, where a link's
    address reaches one neighbour only, the head's control-plane address (its routed node address, or with
    fabric.control_plane: lan its inventory address: what bootstrap binds the control plane to there)."""
    head = session.head
    if ring:
        return control_address(head, session.facts[head.name], routed_control_plane(session.inventory, head))
    return choices[head.name].ip
