"""One doctor run: every node's health in one round trip each (in parallel), the preflight's checks on the facts
already gathered, the fabric's reachability, then the nodes compared, known-bad values named, the kernel log read and each GPU's telemetry judged."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.steps.base import HostContext, NoArgs, Step, StepFailed
from ..node.gputelemetry import GpuTelemetry, read_all, telemetry_json
from ..node.health import NodeHealth, health_command, parse_health
from ..node.kernellog import kernel_log_findings
from ..node.parity import Finding, Node, Severity, known_issues, parity
from ..node.steps.preflight import (
    DEFAULT_MIN_DRIVER,
    DiskArgs,
    DockerNeededArgs,
    DriverArgs,
    GpuArgs,
    PreflightCluster,
    PreflightDisk,
    PreflightDocker,
    PreflightDriver,
    PreflightFabric,
    PreflightGpu,
    PreflightQsfp,
)
from .gpu import findings as gpu_findings


@dataclass(frozen=True)
class DoctorReport:
    image: str
    nodes: dict[str, Node]
    unreachable: dict[str, str]  # node -> why
    findings: tuple[Finding, ...]
    runtime: str = "docker"  # the runtime the checks followed (host: no Docker, no image)
    gpu: dict[str, GpuTelemetry | str] = field(default_factory=dict)  # node -> its GPU's telemetry, or why none

    @property
    def failed(self) -> bool:
        return bool(self.unreachable) or any(f.severity is Severity.FAIL for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not self.failed,
            "runtime": self.runtime,
            "image": self.image,
            "unreachable": self.unreachable,
            "findings": [{"group": f.group, "check": f.check, "severity": f.severity.value, "summary": f.summary,
                          "fix": f.fix, "nodes": list(f.nodes), "values": f.values, "source": f.source}
                         for f in self.findings],
            "nodes": {name: {"facts": n.facts.to_json(), "health": n.health.to_json(),
                             "gpu": telemetry_json(self.gpu[name]) if name in self.gpu else None}
                      for name, n in self.nodes.items()},
        }


def _preflight_steps(vars: Mapping[str, Any], image: str) -> list[Step]:
    """What bootstrap's preflight play runs, with the inventory's settings (min_driver, driver_policy)."""
    return [
        PreflightGpu(GpuArgs(allow_other_gpu=bool(vars.get("allow_other_gpu", False)))),
        PreflightDriver(DriverArgs(min_driver=str(vars.get("min_driver", DEFAULT_MIN_DRIVER)),
                                   policy=str(vars.get("driver_policy", "fail")))),
        PreflightQsfp(NoArgs()),
        PreflightDocker(DockerNeededArgs(needed=bool(image))),
        PreflightDisk(DiskArgs(min_free_gb=int(vars.get("min_free_gb", 50)))),
    ]


def _check(step: Step, host: Host, session: Session) -> Finding:
    try:
        plan = step.check(HostContext(host, session, check_mode=True))
    except StepFailed as e:
        return Finding("preflight", step.name, Severity.FAIL, f"{host.name}: {e.message}", e.fix, (host.name,))
    except SparkclusterError as e:  # a peer's connection failing inside a check names that peer
        return Finding("preflight", step.name, Severity.FAIL, f"{host.name}: {e.message}", e.fix, (host.name,))
    if plan.warnings:
        return Finding("preflight", step.name, Severity.WARN, f"{host.name}: {plan.reason}; {'; '.join(plan.warnings)}",
                       nodes=(host.name,))
    return Finding("preflight", step.name, Severity.OK, f"{host.name}: {plan.reason}", nodes=(host.name,))


def preflight(session: Session, image: str) -> list[Finding]:
    hosts = [h for h in session.hosts if h.name in session.facts]
    per_host = session.each(
        lambda h: [_check(step, h, session) for step in _preflight_steps(h.vars, image)] +
                  [_check(PreflightFabric(NoArgs()), h, session)], hosts)
    findings = [f for found in per_host for f in found]
    head = session.inventory.head
    if head in hosts:  # across every node, judged on the head (warnings only)
        findings.append(_check(PreflightCluster(NoArgs()), head, session))
    return findings


def missing_image(nodes: Mapping[str, Node], head: str, image: str, named: bool) -> list[Finding]:
    """Nodes that hold no `image` yet: how it gets there (a warning), unless --image named it (then it must be there).
    Serve copies the head's image to every node that lacks it, so only a head without it needs the user first."""
    lacking = tuple(name for name, n in nodes.items() if n.health.image.absent)
    if not lacking:
        return []
    where = ", ".join(lacking)
    sync = f"`sparkcluster image sync {image}`"
    if named:
        return [Finding("known issues", "image", Severity.FAIL, f"{where}: no image {image!r}, which --image names",
                        f"build or pull it on {head}, then {sync} copies it to every node", lacking)]
    if head in nodes and head not in lacking:
        return [Finding("known issues", "image", Severity.WARN,
                        f"{where}: no image {image!r} yet; serve copies the head's over the fabric before it starts",
                        f"nothing to do, or copy it now: {sync}", lacking)]
    return [Finding("known issues", "image", Severity.WARN,
                    f"{where}: no image {image!r} yet; serve copies the head's ({head}) to every node, so it needs to be "
                    f"on {head} first (not needed with --runtime host)",
                    f"build it on {head} (eugr's spark-vllm-docker: `./build-and-copy.sh -t {image}`) or pull it there; "
                    f"serve (or {sync}) then sends it to the others", lacking)]


def run_doctor(session: Session, image: str, image_named: bool = False, runtime: str = "docker") -> DoctorReport:
    """`image`: the serving image to compare across nodes, or "" where none is used (a host runtime); `image_named`:
    --image named it, so a node without it fails."""
    unreachable = {n: e.message for n, e in session.unreachable.items()}
    hosts = [h for h in session.hosts if h.name in session.facts]

    def health(host: Host) -> NodeHealth | str:
        result = session.run(host, health_command(image))
        if result.timed_out:
            return f"the doctor's probe timed out after {result.command.timeout} s"
        return parse_health(result.stdout, image)

    nodes: dict[str, Node] = {}
    for host, got in zip(hosts, session.each(health, hosts)):
        if isinstance(got, str):
            unreachable[host.name] = got
        else:
            nodes[host.name] = Node(session.facts[host.name], got)
    findings = preflight(session, image) + parity(nodes)
    for name, node in nodes.items():
        findings += known_issues(name, node, host_runtime=not image)
        findings += kernel_log_findings(name, node.health.kernel_log,
                                        node.facts.gpu.driver_version if node.facts.gpu else None)
    findings += missing_image(nodes, session.inventory.head.name, image, image_named)
    telemetry = read_all(session, [h for h in hosts if h.name in nodes])
    findings += gpu_findings(telemetry)
    return DoctorReport(image, nodes, unreachable, tuple(findings), runtime, telemetry)
