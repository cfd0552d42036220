"""Preflight checks: read-only steps that pass (ok, maybe with warnings) or fail with the fix.

Each node is judged on its own facts; nothing is copied from the head, since nodes differ (a
port cabled on one and not the other, an older driver: docs/failure-modes.md F13, F22).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ...engine.command import Command
from ...engine.facts import HostFacts, driver_tuple
from ...engine.steps.base import HostContext, NoArgs, Plan, Step, StepFailed, register
from ..discovery import fabric_of
from ..fabric import Fabric, Kind
from ..network import QsfpChoice, QsfpError, cabling_report, choose_for, fabric_subnet_mismatch, qsfp_port

GB10 = "NVIDIA GB10"
DEFAULT_MIN_DRIVER = "590.44"


def facts_of(ctx: HostContext) -> HostFacts:
    if ctx.facts is None:
        raise StepFailed("no facts were gathered for this host", "leave gather_facts on for this play")
    return ctx.facts


def qsfp_of(ctx: HostContext, name: str | None = None) -> QsfpChoice:
    """The QSFP binding of a node (this one by default), from its own facts and its inventory pins."""
    host = ctx.host if name is None else next(h for h in ctx.inventory.hosts if h.name == name)
    facts = ctx.all_facts.get(host.name) if name else ctx.facts
    if facts is None:
        raise StepFailed(f"no facts for {host.name}", "it was unreachable earlier in this run")
    try:
        return choose_for(host, facts)
    except QsfpError as e:
        raise StepFailed(e.message, e.fix) from None


def ring_of(ctx: HostContext) -> Fabric | None:
    """The fabric discovery found, where some node has both QSFP ports Up (a ring); None on a pair or a switch,
    whose nodes are configured from their own facts without a probe."""
    both = any(len({qsfp_port(d.netdev) for d in f.rdma if d.up} - {None}) > 1 for f in ctx.all_facts.values())
    return fabric_of(ctx.session) if both else None


@dataclass(frozen=True)
class GpuArgs:
    allow_other_gpu: bool = False


@register
class PreflightGpu(Step):
    name = "preflight.gpu"
    Args = GpuArgs

    def check(self, ctx: HostContext) -> Plan:
        facts = facts_of(ctx)
        if facts.gpu is None:
            raise StepFailed(f"no NVIDIA GPU found: {facts.gpu_error}",
                             "check the NVIDIA driver: `nvidia-smi` must list the GB10")
        names = ", ".join(g.name for g in facts.gpus)
        if facts.gpu.name == GB10:
            return Plan(f"{names}")
        if self.args.allow_other_gpu:
            return Plan(f"{names}", warnings=(f"not a DGX Spark GPU ({GB10} expected); going on as asked",))
        raise StepFailed(f"the GPU is {names}, not an {GB10}",
                         "sparkcluster is made for DGX Sparks; pass --allow-other-gpu to go on anyway")


@dataclass(frozen=True)
class DriverArgs:
    min_driver: str = DEFAULT_MIN_DRIVER
    policy: str = "fail"  # or "warn"


@register
class PreflightDriver(Step):
    name = "preflight.driver"
    Args = DriverArgs

    def check(self, ctx: HostContext) -> Plan:
        if self.args.policy not in ("fail", "warn"):
            raise StepFailed(f"driver policy must be fail or warn, not {self.args.policy!r}")
        floor = driver_tuple(self.args.min_driver)
        if not floor:
            raise StepFailed(f"invalid minimum driver version {self.args.min_driver!r}", "e.g. --min-driver 590.44")
        gpu = facts_of(ctx).gpu
        if gpu is None:
            raise StepFailed("no NVIDIA driver answers (nvidia-smi)", "install the NVIDIA driver (DGX OS ships it)")
        version = driver_tuple(gpu.driver_version)
        if version >= floor:
            return Plan(f"driver {gpu.driver_version} >= {self.args.min_driver}")
        if not version:  # no number at all: unknown, which is no evidence of an old driver
            message = f"{ctx.host.name} reports an NVIDIA driver version that cannot be read: {gpu.driver_version!r}"
            fix = (f"run `nvidia-smi --query-gpu=driver_version --format=csv,noheader` on {ctx.host.name}: it must "
                   "print the version alone, e.g. 590.48.01 (a wrapper that adds to nvidia-smi's output breaks that)")
        else:
            message, fix = _below_floor(ctx.host.name, gpu.driver_version, self.args.min_driver)
        if self.args.policy == "warn":
            return Plan(f"driver {gpu.driver_version}", warnings=(f"{message}; {fix}",))
        raise StepFailed(message, fix)


def _below_floor(host: str, driver: str, floor: str) -> tuple[str, str]:
    message = f"{host} runs NVIDIA driver {driver}, below the floor {floor}"
    if driver.startswith("580."):
        message += (" (stock DGX OS 580.x; images built for CUDA 13.1 need >= 590.44 or CUDA forward "
                    "compatibility, which some refuse: 'compatibility mode is UNAVAILABLE')")
    fix = (f"upgrade the driver to >= {floor} (DGX OS: sudo apt update && sudo apt full-upgrade, "
           "reboot), or use an image that runs in CUDA forward-compatibility mode on 580.x and lower the floor "
           "with --min-driver 580.95 (or min_driver: in the inventory), or pass --driver-policy warn")
    return message, fix


@register
class PreflightQsfp(Step):
    name = "preflight.qsfp"
    Args = NoArgs

    def check(self, ctx: HostContext) -> Plan:
        q = qsfp_of(ctx)
        speed = f"{q.speed_mbps // 1000} Gb/s" if q.speed_mbps else "speed unknown"
        port = f"port {q.port}" if q.port is not None else "port ?"
        reason = (f"{q.netdev} {q.ip}/{q.prefix} ({port}, {q.source}), RDMA {','.join(q.hcas)}, "
                  f"MTU {q.mtu}, {speed}, GID index {q.gid_index if q.gid_index is not None else '-'}")
        fabric = ring_of(ctx)
        if fabric is not None and fabric.kind is Kind.RING:
            # A ring cables both ports, each to a neighbour: every Up twin's HCA carries NCCL (comm.env lists them).
            hcas = [d.hca for d in facts_of(ctx).rdma if d.up and qsfp_port(d.netdev) is not None]
            reason = f"ring node: both ports cabled, RDMA {','.join(hcas)}, MTU {q.mtu}, {speed}"
            return Plan(reason, warnings=tuple(w for w in q.warnings if not w.startswith("RDMA devices are Up on")))
        return Plan(reason, warnings=q.warnings)


@dataclass(frozen=True)
class DockerNeededArgs:
    needed: bool = True  # false for `--runtime host`: Ray and vLLM run from a Python environment


@register
class PreflightDocker(Step):
    name = "preflight.docker"
    Args = DockerNeededArgs

    def check(self, ctx: HostContext) -> Plan:
        if not self.args.needed:
            return Plan("the host runtime needs no Docker", skip=True)
        d = facts_of(ctx).docker
        if not d.installed:
            raise StepFailed("docker is not installed", "install Docker and the NVIDIA container toolkit "
                             "(DGX OS ships both; else: sudo apt-get install docker.io nvidia-container-toolkit)")
        if not d.daemon_up:
            raise StepFailed("the docker daemon is not running (no /var/run/docker.sock)",
                             "sudo systemctl enable --now docker")
        if not d.nvidia_runtime:
            raise StepFailed("the NVIDIA container runtime is missing: `docker run --gpus all` would fail",
                             "sudo apt-get install nvidia-container-toolkit && sudo nvidia-ctk runtime configure "
                             "--runtime=docker && sudo systemctl restart docker")
        return Plan("docker installed, daemon up, NVIDIA runtime present")


@dataclass(frozen=True)
class DiskArgs:
    min_free_gb: int = 50


@register
class PreflightDisk(Step):
    name = "preflight.disk"
    Args = DiskArgs

    def check(self, ctx: HostContext) -> Plan:
        facts = facts_of(ctx)
        free = facts.hf_free_bytes
        if free is None:
            return Plan(f"HF cache {facts.hf_cache}", warnings=("could not read the free space there",))
        reason = f"HF cache {facts.hf_cache}: {free / 2**30:.0f} GiB free"
        if free < self.args.min_free_gb * 2**30:
            return Plan(reason, warnings=(f"less than {self.args.min_free_gb} GiB free for model weights",))
        return Plan(reason)


@register
class PreflightCluster(Step):
    """On the head, across every node: the same login user and the same cabled port (warnings only; a problem
    that belongs to one node fails that node, in its own steps)."""

    name = "preflight.cluster"
    Args = NoArgs

    def check(self, ctx: HostContext) -> Plan:
        hosts = [h for h in ctx.inventory.hosts if h.name in ctx.all_facts]
        users = {h.name: ctx.all_facts[h.name].user for h in hosts}
        warnings = []
        if len(set(users.values())) > 1:
            listing = ", ".join(f"{n}: {u}" for n, u in users.items())
            warnings.append(f"login users differ ({listing}); sparkcluster resolves paths on each node, but "
                            "eugr's and NVIDIA's scripts assume one user name everywhere")
        choices = {}
        for h in [ctx.inventory.head, *[h for h in hosts if h.role != "head"]]:
            try:
                choices[h.name] = qsfp_of(ctx, h.name)
            except StepFailed:
                continue  # that node fails its own preflight.qsfp, with its own message
        warnings += cabling_report(choices)
        return Plan(f"{len(hosts)} nodes checked together", warnings=tuple(warnings))


@register
class PreflightFabric(Step):
    """Every node reaches every other node over the QSFP addresses (not over the LAN)."""

    name = "preflight.fabric"
    Args = NoArgs

    def check(self, ctx: HostContext) -> Plan:
        planned = [h.name for h in ctx.inventory.hosts if ctx.is_planned(h.name)]
        if planned:  # check mode: addresses that exist only in the plan answer no ping yet
            return Plan(f"the fabric addresses of {', '.join(planned)} are planned, not applied: bootstrap checks "
                        "that every node reaches the others once it has applied them", skip=True)
        fabric = ring_of(ctx)
        if fabric is not None:
            return self._links(ctx, fabric)
        mine = qsfp_of(ctx)
        head = ctx.inventory.head
        if ctx.host.name != head.name and head.name in ctx.all_facts:
            # The head's sockets bind to its QSFP address: a node outside that subnet is not on-link.
            mismatch = fabric_subnet_mismatch({head.name: qsfp_of(ctx, head.name), ctx.host.name: mine})
            if mismatch:
                raise StepFailed(mismatch[0], "give the node's QSFP interface an address in the head's subnet "
                                              "(or pin qsfp_interface/fabric_ip for it in the inventory)")
        peers, skipped = {}, []
        for h in ctx.inventory.hosts:
            if h.name == ctx.host.name or h.name not in ctx.all_facts:
                continue
            try:
                peer = qsfp_of(ctx, h.name)
            except StepFailed:
                continue  # that node fails its own preflight.qsfp
            if fabric_subnet_mismatch({ctx.host.name: mine, h.name: peer}):
                skipped.append(f"{h.name} ({peer.ip}) is not on this node's QSFP subnet; it fails its own check")
            else:
                peers[h.name] = peer.ip
        if not peers:
            return Plan("no peers to reach", warnings=tuple(skipped))
        # One command pings every peer in parallel, out of this node's QSFP interface only.
        pings = " ".join(
            f"(ping -c 1 -i 0.2 -w 5 -I {shlex.quote(mine.netdev)} {shlex.quote(ip)} >/dev/null 2>&1 "
            f"&& echo {shlex.quote(name)} ok) &" for name, ip in peers.items())
        out = ctx.run(Command(f"PATH=$PATH:/usr/sbin:/sbin; {pings} wait", timeout=30)).stdout
        # A peer passes only by answering: a killed or timed-out batch fails them all.
        answered = {line.split()[0] for line in out.splitlines() if line.endswith(" ok")}
        failed = sorted(set(peers) - answered)
        if failed:
            ctx.probe_peers(failed)  # a peer that is down altogether is its own failure, not this node's
            listing = ", ".join(f"{n} ({peers[n]})" for n in failed)
            raise StepFailed(f"cannot reach {listing} over {mine.netdev}",
                             "check the QSFP cable/switch and that both ends are up with addresses in one subnet: "
                             f"ping -I {mine.netdev} <peer fabric ip>")
        return Plan(f"reaches {', '.join(f'{n} ({ip})' for n, ip in peers.items())} over {mine.netdev}",
                    warnings=tuple(skipped))

    def _links(self, ctx: HostContext, fabric: Fabric) -> Plan:
        """On a ring each cable is its own subnets: each twin must reach the neighbour at its link's far end."""
        targets = []
        for end, link in fabric.ends_of(ctx.host.name):
            far = link.b if end == link.a else link.a
            facts = ctx.all_facts.get(far.node)
            interface = facts.interface(far.netdev) if facts else None
            if interface and interface.ipv4:
                targets.append((end.netdev, far.node, str(interface.ipv4[0].ip)))
        if not targets:
            return Plan("no neighbour on the ring has an address yet")
        pings = " ".join(f"(ping -c 1 -i 0.2 -w 5 -I {shlex.quote(n)} {shlex.quote(ip)} >/dev/null 2>&1 "
                         f"&& echo {shlex.quote(ip)} ok) &" for n, _, ip in targets)
        out = ctx.run(Command(f"PATH=$PATH:/usr/sbin:/sbin; {pings} wait", timeout=30)).stdout
        answered = {line.split()[0] for line in out.splitlines() if line.endswith(" ok")}
        failed = [t for t in targets if t[2] not in answered]
        if failed:
            ctx.probe_peers(sorted({node for _, node, _ in failed}))
            listing = ", ".join(f"{node} ({ip}) over {n}" for n, node, ip in failed)
            raise StepFailed(f"cannot reach {listing}", "check that cable and both ends' addresses (sparkcluster "
                             "topology shows each link)")
        return Plan("reaches " + ", ".join(f"{node} ({ip}) over {n}" for n, node, ip in targets))
