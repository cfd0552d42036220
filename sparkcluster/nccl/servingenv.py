"""Before the probe runs: each node's serving env is where bootstrap left it (the comm env file), binds the comm
libraries to the QSFP link, and advertises control-plane addresses every node can reach."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.remote import source_env
from ..engine.session import Session
from ..engine.transport import remote_path
from ..node.network import COMM_ENV_PATH, QsfpChoice, comm_env_path
from . import controlplane
from .binding import Misbinding, misbindings, parse_env
from .controlplane import ControlAddress
from .proberun import RunInEnv
from .verdict import Verdict, VerdictStatus


def check_comm_env(session: Session) -> dict[str, str]:
    """Each node's comm env file (bootstrap wrote it; its path may be set in the inventory, comm_env_path)."""
    env_files = {h.name: remote_path(comm_env_path(h)) for h in session.hosts}
    missing = [h.name for h in session.hosts
               if not session.run(h, Command(f"test -f {shlex.quote(env_files[h.name])}")).ok]
    if missing:
        raise SparkclusterError(f"no comm env ({COMM_ENV_PATH}) on {', '.join(missing)}: the probe must run in the "
                                "environment vLLM gets", "run `sparkcluster bootstrap` first")
    return env_files


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
