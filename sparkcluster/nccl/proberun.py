"""The probe as commands, one rank per node (rank 0 on the head), run at once; and which backend the head's PyTorch
offers it (NCCL on a GPU, gloo on CPU)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.remote import python_line, python_of, source_env
from ..engine.session import Session
from ..engine.transport import Transport
from ..node.linkstate import nodes_with_links_down
from .lastlog import keep_log

MASTER_PORT = 29577
RENDEZVOUS_TIMEOUT_S = 60  # ranks give up waiting for each other after this: a failed rank must not hang the rest
TORCH_CHECK = "import torch; print(torch.cuda.is_available())"


def detect_backend(transport: Transport, check_line: str) -> str:
    result = transport.run(Command(check_line, timeout=120))
    if not result.ok:
        raise SparkclusterError(f"PyTorch is not usable on the head ({check_line}): {result.stderr_tail(2)}",
                                "install torch there, or set `python:` in the inventory to an interpreter that has it; "
                                "`serve --no-verify` skips the probe")
    return "nccl" if result.stdout.strip() == "True" else "gloo"


RunInEnv = Callable[[list[str]], Command]  # per node: the command that runs argv where vLLM will run


def probe_commands(session: Session, master: str, backend: str, sizes: str | None, env_files: Mapping[str, str],
                   script: str, timeout: float, in_serving_env: Mapping[str, RunInEnv] | None,
                   extra_env: Mapping[str, Mapping[str, str]] | None = None, port: int = MASTER_PORT,
                   probe_args: Sequence[str] = (), unset: Sequence[str] = ()) -> dict[str, Command]:
    """Node -> the command that runs its rank of the probe (rank 0 on the head), as a value: nothing runs here.
    `probe_args` go to the probe after the rendezvous; `unset` names comm env variables the probe runs without
    (verify --tune measures NCCL's default beside a tuned comm env)."""
    hosts = session.hosts
    commands = {}
    for rank, host in enumerate(hosts):
        args = ["--rank", str(rank), "--world", str(len(hosts)), "--master-addr", master,
                "--master-port", str(port), "--backend", backend, "--timeout", str(RENDEZVOUS_TIMEOUT_S)]
        if sizes:
            args += ["--sizes", sizes]
        args += list(probe_args)
        extra = dict((extra_env or {}).get(host.name, {}))
        if in_serving_env is not None:
            pinned = [f"{k}={v}" for k, v in extra.items()]
            probe = in_serving_env[host.name](["env", "NCCL_DEBUG=INFO", *pinned, "python3", "-", *args])
            commands[host.name] = replace(probe, script=probe.script + " 2>&1", stdin=script, timeout=timeout + 60)
            continue
        exports = "".join(f"unset {k}; " for k in unset if k not in extra)
        exports += "".join(f"{k}={shlex.quote(v)}; export {k}; " for k, v in extra.items())
        line = (f"{source_env(env_files[host.name])}; NCCL_DEBUG=INFO; export NCCL_DEBUG; {exports}"
                f"exec {python_line(python_of(host), script, *args)} 2>&1")
        commands[host.name] = Command(f"cd; {line}", timeout=timeout + 60)
    return commands


class ProbeTimedOut(SparkclusterError):
    """A rank that did not finish in its time: the link under it is slow, which is not the same as dead."""


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
            if result.timed_out:
                raise ProbeTimedOut(f"the probe on {host.name} did not finish within {result.duration:.0f} s",
                                    "a link that slow is slowed, not cut: time it with `ping -c 5 -I NETDEV PEER` on "
                                    "the node (a healthy twin answers in well under a millisecond)")
            tail = "\n".join(result.stdout.strip().splitlines()[-8:]) or result.stderr_tail(8)
            last = tail.splitlines()[-1].strip() if tail.strip() else "no output"
            # The first line says why on its own: verdicts quote only that line.
            raise SparkclusterError(f"the probe failed on {host.name} (exit {result.exit_code}): {last}\n{tail}",
                                    "run `sparkcluster bootstrap` first; check torch on the node and that the "
                                    "nodes reach each other on the fabric")
        return host.name, result.stdout
    return dict(session.each(launch))
