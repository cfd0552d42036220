"""Where a node's Ray and vLLM run: in the vllm_node container (docker, eugr's setup) or as processes from a
Python environment on the node (host). Each runtime turns "start this, detached", "is it alive", "show its
log" and "stop everything" into one shell line for the node.

Everything starts detached from the SSH session (a container with -d, or setsid + nohup with a pid file),
so the cluster keeps serving when the CLI exits or is killed (F20: eugr's and vLLM's scripts stop the
cluster from an EXIT trap).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..engine.command import shell_path
from .launch import CONTAINER, docker_run_line

HOST_STATE_DIR = "~/.cache/sparkcluster/serve"  # host runtime: <role>.pid and <role>.log
CONTAINER_VLLM_LOG = "/tmp/sparkcluster-vllm.log"
CONTAINER_VLLM_PID = "/tmp/sparkcluster-vllm.pid"
STOP_GRACE_S = 10


@dataclass(frozen=True)
class NodeEnv:
    """What a node's processes get: the comm env file bootstrap wrote, plus fixed variables."""

    env_file: str  # remote path, `~/` allowed
    env: Mapping[str, str] = field(default_factory=dict)


class Runtime:
    name = ""

    def start_main(self, argv: Sequence[str], env: NodeEnv) -> str:
        """The node's long-lived process: Ray (ray launcher) or its vLLM rank (native launcher)."""
        raise NotImplementedError

    def start_vllm_on_main(self, argv: Sequence[str], env: NodeEnv) -> str:
        """`vllm serve` beside the head's Ray (ray launcher)."""
        raise NotImplementedError

    def run_in_env(self, argv: Sequence[str], env: NodeEnv, twin: bool = False) -> str:
        """A foreground command in the environment the serving processes see (Ray queries, the probe).
        twin: where the main process is not running, a short-lived copy of its environment may stand in."""
        raise NotImplementedError

    def alive(self, role: str) -> str:
        """Exit 0 when `role` ("main" or "vllm") runs."""
        raise NotImplementedError

    def logs(self, role: str, lines: int, follow: bool) -> str:
        raise NotImplementedError

    def stop_vllm(self) -> str:
        """Stop the `vllm serve` started beside Ray, and wait until it is gone (Ray stays up)."""
        raise NotImplementedError

    def stop_all(self) -> str:
        """Stop whatever serving ran here, idempotently; prints one word per stopped thing."""
        raise NotImplementedError


@dataclass(frozen=True)
class DockerRuntime(Runtime):
    image: str
    entrypoint: tuple[str, ...] | None = None
    docker_args: tuple[str, ...] = ()
    name = "docker"

    def start_main(self, argv: Sequence[str], env: NodeEnv) -> str:
        return docker_run_line(self.image, shell_path(env.env_file), argv, entrypoint=self.entrypoint,
                               env=env.env, docker_args=self.docker_args)

    def start_vllm_on_main(self, argv: Sequence[str], env: NodeEnv) -> str:
        # The container already holds the env (--env-file, -e): no `bash -i` and .bashrc needed, as in eugr's.
        inner = f"echo $$ > {CONTAINER_VLLM_PID}; exec {shlex.join(argv)} >> {CONTAINER_VLLM_LOG} 2>&1"
        return f"docker exec -d {CONTAINER} sh -c {shlex.quote(inner)}"

    def run_in_env(self, argv: Sequence[str], env: NodeEnv, twin: bool = False) -> str:
        """In the running vllm_node; with `twin`, where it does not run, in a short-lived container with the
        same flags and env (the probe before the native launcher's containers exist)."""
        exec_line = f"docker exec -i {CONTAINER} {shlex.join(argv)}"
        if not twin:
            return exec_line
        fresh = docker_run_line(self.image, shell_path(env.env_file), argv, entrypoint=self.entrypoint, env=env.env,
                                docker_args=self.docker_args, detached=False)
        return f"if {self.alive('main')}; then {exec_line}; else {fresh}; fi"

    def alive(self, role: str) -> str:
        if role == "main":
            return f"test \"$(docker inspect -f '{{{{.State.Running}}}}' {CONTAINER} 2>/dev/null)\" = true"
        return f"docker exec {CONTAINER} sh -c 'kill -0 $(cat {CONTAINER_VLLM_PID} 2>/dev/null) 2>/dev/null'"

    def logs(self, role: str, lines: int, follow: bool) -> str:
        f = " -f" if follow else ""
        if role == "main":
            return f"docker logs --tail {lines}{f} {CONTAINER} 2>&1"
        return f"docker exec {CONTAINER} tail -n {lines}{f} {CONTAINER_VLLM_LOG}"

    def stop_vllm(self) -> str:
        inner = (f"p=$(cat {CONTAINER_VLLM_PID} 2>/dev/null) && kill $p 2>/dev/null; "
                 "while kill -0 $p 2>/dev/null; do sleep 0.2; done; true")
        return f"docker exec {CONTAINER} sh -c {shlex.quote(inner)}"

    def stop_all(self) -> str:
        return (f"if docker inspect {CONTAINER} >/dev/null 2>&1; then docker stop -t {STOP_GRACE_S} {CONTAINER} "
                f">/dev/null 2>&1; docker rm -f {CONTAINER} >/dev/null 2>&1; echo container; fi; "
                f"! docker inspect {CONTAINER} >/dev/null 2>&1")


@dataclass(frozen=True)
class HostRuntime(Runtime):
    python_env: str  # a virtual environment on the node holding ray and vllm
    name = "host"

    def _enter(self, env: NodeEnv) -> str:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.env.items()))
        env_file = shell_path(env.env_file)
        return (f"cd || exit 1\nset -a; . {env_file} || exit 1; set +a\n"
                f"export PATH={shell_path(self.python_env)}/bin:\"$PATH\" {exports}\n")

    def _start(self, role: str, argv: Sequence[str], env: NodeEnv) -> str:
        d = shell_path(HOST_STATE_DIR)
        return (f"mkdir -p {d} || exit 1\n{self._enter(env)}"
                f"if kill -0 $(cat {d}/{role}.pid 2>/dev/null) 2>/dev/null; then echo 'already running' >&2; exit 3; fi\n"
                f"setsid nohup {shlex.join(argv)} > {d}/{role}.log 2>&1 < /dev/null &\n"
                f"echo $! > {d}/{role}.pid")

    def start_main(self, argv: Sequence[str], env: NodeEnv) -> str:
        return self._start("main", argv, env)

    def start_vllm_on_main(self, argv: Sequence[str], env: NodeEnv) -> str:
        return self._start("vllm", argv, env)

    def run_in_env(self, argv: Sequence[str], env: NodeEnv, twin: bool = False) -> str:
        return f"{self._enter(env)}exec {shlex.join(argv)}"

    def alive(self, role: str) -> str:
        return f"kill -0 $(cat {shell_path(HOST_STATE_DIR)}/{role}.pid 2>/dev/null) 2>/dev/null"

    def logs(self, role: str, lines: int, follow: bool) -> str:
        return f"tail -n {lines}{' -f' if follow else ''} {shell_path(HOST_STATE_DIR)}/{role}.log"

    def stop_vllm(self) -> str:
        d = shell_path(HOST_STATE_DIR)
        return (f"p=$(cat {d}/vllm.pid 2>/dev/null) && kill -TERM -- -$p 2>/dev/null && "
                f"while kill -0 $p 2>/dev/null; do sleep 0.2; done; rm -f {d}/vllm.pid; true")

    def stop_all(self) -> str:
        d = shell_path(HOST_STATE_DIR)
        # setsid made each process a group leader: signal the whole group (Ray's raylet, vLLM's workers).
        stop_one = (f"p=$(cat {d}/$r.pid 2>/dev/null); if [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null; then "
                    f"kill -TERM -- -\"$p\" 2>/dev/null; i=0; while kill -0 \"$p\" 2>/dev/null && [ $i -lt {STOP_GRACE_S * 5} ]; "
                    f"do sleep 0.2; i=$((i+1)); done; kill -KILL -- -\"$p\" 2>/dev/null; echo $r; fi; rm -f {d}/$r.pid")
        ray = f"{shell_path(self.python_env)}/bin/ray"
        return (f"for r in vllm main; do {stop_one}; done; "
                f"if [ -x {ray} ] && pgrep -u \"$(id -u)\" -f 'ray/core/src/ray/(raylet|gcs)' >/dev/null 2>&1; then "
                f"{ray} stop --force >/dev/null 2>&1; echo ray; fi; true")
