"""Where a node's Ray and vLLM run: in the vllm_node container (docker, eugr's setup) or as processes from a
Python environment on the node (host). Each runtime turns "start this, detached", "is it alive", "show its
log" and "stop everything" into one `Command` for the node, so tests compare them as values.

Everything starts detached from the SSH session (a container with -d, or setsid + nohup with a pid file),
so the cluster keeps serving when the CLI exits or is killed (F20: eugr's and vLLM's scripts stop the
cluster from an EXIT trap).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..engine.command import Command, env_on_stdin, exports, read_env_from_stdin, shell_path
from ..engine.errors import UsageError
from ..engine.inventory import Host, Inventory
from ..engine.inventory.writeback import set_shared_var
from ..engine.remote import source_env
from ..staging.images import ImageInfo
from .apikey import API_KEY_ENV
from .caches import host_exports, make_dir_line
from .keptlog import (
    KEEPER_STOP_S,
    KEPT_ROLES,
    SERVE_STATE_DIR,
    container_output,
    file_output,
    keep_host_output,
    keep_output,
    kept_log,
    logs_or_kept,
    output_fifo,
    stop_keeper,
)
from .launch import (
    CONTAINER,
    DEFAULT_IMAGE,
    LAUNCHERS,
    RUNTIMES,
    Launcher,
    RuntimeName,
    container_command,
    docker_run_line,
)

CONTAINER_VLLM_LOG = "/tmp/sparkcluster-vllm.log"
CONTAINER_VLLM_PID = "/tmp/sparkcluster-vllm.pid"
ROUTER_CONTAINER = "vllm_router"  # docker: the router in a container of its own, from the same image
STOP_GRACE_S = 10
KILL_WAIT_S = 5  # after SIGKILL, how long down waits for the kernel to end the processes


@dataclass(frozen=True)
class NodeEnv:
    """What a node's processes get: the comm env file bootstrap wrote, plus fixed variables, plus secrets (the
    values of secret-like names: HF_TOKEN...), which the start commands read from stdin: any user of a node can
    read a command line (`ps`), and --check shows them. Commands that only query the serving env (the probe,
    Ray's members) do without the secrets."""

    env_file: str  # remote path, `~/` allowed
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)

    @property
    def api_key(self) -> str | None:
        """The key vLLM started with this env wants of its clients (serving/apikey.py); None: it wants none."""
        return self.secrets.get(API_KEY_ENV) or None

    def reader(self) -> str:
        """The line that takes the secrets off stdin, first in a start command (empty without secrets)."""
        return f"{read_env_from_stdin()}\n" if self.secrets else ""

    def started(self, script: str) -> Command:
        """A start command: the secrets on its stdin (and masked wherever it is shown)."""
        if not self.secrets:
            return Command(script)
        return Command(self.reader() + script, stdin=env_on_stdin(self.secrets),
                       secrets=tuple(v for v in self.secrets.values() if v))


class Runtime:
    name = ""

    def start_main(self, argv: Sequence[str], env: NodeEnv) -> Command:
        """The node's long-lived process: Ray (ray launcher) or its vLLM rank (native launcher)."""
        raise NotImplementedError

    def start_vllm_on_main(self, argv: Sequence[str], env: NodeEnv) -> Command:
        """`vllm serve` beside the head's Ray (ray launcher)."""
        raise NotImplementedError

    def start_router(self, argv: Sequence[str], env: NodeEnv) -> Command:
        """The router in front of replicas (the head's, beside its replica's vLLM), detached like vLLM."""
        raise NotImplementedError

    def run_in_env(self, argv: Sequence[str], env: NodeEnv, twin: bool = False) -> Command:
        """A foreground command in the environment the serving processes see (Ray queries, the probe).
        twin: where the main process is not running, a short-lived copy of its environment may stand in."""
        raise NotImplementedError

    def alive(self, role: str) -> Command:
        """Exits 0 when `role` ("main", "vllm" or "router") runs."""
        raise NotImplementedError

    def logs(self, role: str, lines: int, follow: bool) -> Command:
        """The last `lines` of `role`'s log, stderr included; `follow` keeps streaming."""
        raise NotImplementedError

    def stop_vllm(self) -> Command:
        """Stop the `vllm serve` started beside Ray, and wait until it is gone (Ray stays up)."""
        raise NotImplementedError

    def stop_all(self) -> Command:
        """Stop whatever serving ran here, idempotently; prints one word per stopped thing."""
        raise NotImplementedError

    def stop_main(self) -> Command:
        """Stop the node's main process alone (a replica's rank), leaving the router beside it serving."""
        raise NotImplementedError


@dataclass(frozen=True)
class DockerRuntime(Runtime):
    image: str
    entrypoint: tuple[str, ...] | None = None
    docker_args: tuple[str, ...] = ()
    caches: bool = False  # the node's compile/JIT cache directory mounted (RuntimeChoice turns it on by default)
    name = "docker"

    def start_main(self, argv: Sequence[str], env: NodeEnv) -> Command:
        # `-e NAME` without a value: docker takes it from its client's environment, where the reader put it. eugr's
        # line exactly, then the keeper of its output (keptlog.py): its --rm takes `docker logs` along when it exits.
        line = docker_run_line(self.image, shell_path(env.env_file), argv, entrypoint=self.entrypoint, env=env.env,
                               docker_args=self.docker_args, caches=self.caches, pass_env=tuple(env.secrets))
        return env.started(f"{line} && {keep_output(container_output(CONTAINER), 'main')}")

    def start_vllm_on_main(self, argv: Sequence[str], env: NodeEnv) -> Command:
        # The container already holds the env (--env-file, -e): no `bash -i` and .bashrc needed, as in eugr's. Its
        # secrets are passed again, by name: vLLM's own (its API key) were not among Ray's when the container started.
        inner = f"echo $$ > {CONTAINER_VLLM_PID}; exec {shlex.join(argv)} >> {CONTAINER_VLLM_LOG} 2>&1"
        by_name = [a for name in sorted(env.secrets) for a in ("-e", name)]
        line = shlex.join(["docker", "exec", "-d", *by_name, CONTAINER, "sh", "-c", inner])
        # Its log is a file inside vllm_node, gone with it: kept on the node as the containers' output is.
        return env.started(f"{line} && {keep_output(file_output(CONTAINER, CONTAINER_VLLM_LOG, CONTAINER_VLLM_PID), 'vllm')}")

    def start_router(self, argv: Sequence[str], env: NodeEnv) -> Command:
        # A container of its own (no GPU, the host's network), so that a replica's vllm_node stops and starts alone.
        # The image must hold vllm-router (`pip install vllm-router` in its Dockerfile: docs/serve.md, "TP or replicas?").
        # Its key guard takes the API key by name from the reader's environment (`-e NAME`), never on a command line.
        options, command = container_command(argv, self.entrypoint)
        by_name = [a for name in sorted(env.secrets) for a in ("-e", name)]
        line = shlex.join(["docker", "run", "-d", "--rm", "--network", "host", "--name", ROUTER_CONTAINER,
                           *by_name, *options, self.image, *command])
        return env.started(f"{line} && {keep_output(container_output(ROUTER_CONTAINER), 'router')}")

    def run_in_env(self, argv: Sequence[str], env: NodeEnv, twin: bool = False) -> Command:
        """In the running vllm_node; with `twin`, where it does not run, in a short-lived container with the
        same flags and env (the probe before the native launcher's containers exist)."""
        exec_line = shlex.join(["docker", "exec", "-i", CONTAINER, *argv])
        if not twin:
            return Command(exec_line)
        fresh = docker_run_line(self.image, shell_path(env.env_file), argv, entrypoint=self.entrypoint, env=env.env,
                                docker_args=self.docker_args, detached=False, caches=self.caches)
        return Command(f"if {self.alive('main').script}; then {exec_line}; else {fresh}; fi")

    def alive(self, role: str) -> Command:
        if role in ("main", "router"):
            name = CONTAINER if role == "main" else ROUTER_CONTAINER
            return Command(f"test \"$(docker inspect -f '{{{{.State.Running}}}}' {name} 2>/dev/null)\" = true")
        return Command(f"docker exec {CONTAINER} sh -c 'kill -0 $(cat {CONTAINER_VLLM_PID} 2>/dev/null) 2>/dev/null'")

    def logs(self, role: str, lines: int, follow: bool) -> Command:
        # Once the container is gone, what was kept of it on the node (keptlog.py).
        f = ["-f"] if follow else []
        if role in ("main", "router"):
            name = CONTAINER if role == "main" else ROUTER_CONTAINER
            return Command(logs_or_kept(name, role, lines, shlex.join(["docker", "logs", "--tail", str(lines), *f, name])
                                        + " 2>&1"))
        live = shlex.join(["docker", "exec", CONTAINER, "tail", "-n", str(lines), *f, CONTAINER_VLLM_LOG]) + " 2>&1"
        return Command(logs_or_kept(CONTAINER, role, lines, live))

    def stop_vllm(self) -> Command:
        inner = (f"p=$(cat {CONTAINER_VLLM_PID} 2>/dev/null) && kill $p 2>/dev/null; "
                 "while kill -0 $p 2>/dev/null; do sleep 0.2; done; true")
        return Command.argv(["docker", "exec", CONTAINER, "sh", "-c", inner])

    def stop_all(self) -> Command:
        router = (f"if docker inspect {ROUTER_CONTAINER} >/dev/null 2>&1; then docker rm -f {ROUTER_CONTAINER} "
                  ">/dev/null 2>&1; echo router; fi; ")
        return Command(router + self._stop_container(KEPT_ROLES))

    def stop_main(self) -> Command:
        return Command(self._stop_container(tuple(r for r in KEPT_ROLES if r != "router")))

    def _stop_container(self, kept_roles: Sequence[str]) -> str:
        # vLLM first, then the container. Ray, the container's main process, drains on SIGTERM until its node is idle,
        # which it is not while vLLM holds Ray workers: `docker stop` alone waited out its whole grace and killed both.
        # vLLM, given its SIGTERM and up to the grace to exit, shuts down cleanly, and then Ray stops at once.
        vllm = (f"docker exec {CONTAINER} sh -c 'p=$(cat {CONTAINER_VLLM_PID} 2>/dev/null) && kill $p 2>/dev/null && "
                f"i=0; while kill -0 $p 2>/dev/null && [ $i -lt {STOP_GRACE_S * 5} ]; do sleep 0.2; i=$((i+1)); done' "
                ">/dev/null 2>&1; ")
        # A --rm container is removed by the daemon after it stops, a moment later: `docker rm -f` may find the
        # removal in progress, and a `docker run --name` at once would find the name still taken. Wait until gone.
        gone = (f"i=0; while docker inspect {CONTAINER} >/dev/null 2>&1 && [ $i -lt {STOP_GRACE_S * 5} ]; "
                f"do sleep 0.2; i=$((i+1)); done")
        # The keepers end by themselves once their container is gone and its last lines are copied; a stuck one is stopped.
        keepers = "; ".join(stop_keeper(role, KEEPER_STOP_S) for role in kept_roles)
        return (f"if docker inspect {CONTAINER} >/dev/null 2>&1; then {vllm}docker stop -t {STOP_GRACE_S} {CONTAINER} "
                f">/dev/null 2>&1; docker rm -f {CONTAINER} >/dev/null 2>&1; echo container; fi; {gone}; {keepers}; "
                f"! docker inspect {CONTAINER} >/dev/null 2>&1")


@dataclass(frozen=True)
class HostRuntime(Runtime):
    # A virtual environment on the node holding ray and vllm; None before one exists (after `bootstrap --runtime
    # host`): watching, reading logs and stopping need none, entering the serving env (a start, the probe) does.
    python_env: str | None
    caches: bool = False  # the node's compile/JIT cache directory in every library's variable
    node: str = field(default="", compare=False)  # named in the error of an env without python_env
    name = "host"

    def _enter(self, env: NodeEnv) -> str:
        if self.python_env is None:  # serve and up refuse this before connecting (RuntimeChoice.check_starts)
            raise no_python_env(self.node)
        # The comm env first, then the caches, then the fixed variables, so a recipe's or the inventory's serve_env wins.
        fixed = f" {exports(env.env)}" if env.env else ""
        caches = f"{make_dir_line()} && {host_exports()}\n" if self.caches else ""
        return (f"cd || exit 1\n{source_env(env.env_file)}\n{caches}"
                f"export PATH={shell_path(self.python_env)}/bin:\"$PATH\"{fixed}\n")

    def _start(self, role: str, argv: Sequence[str], env: NodeEnv) -> Command:
        # Private: the log may hold clients' prompts and completions (keptlog.py); its keeper bounds it.
        d = shell_path(SERVE_STATE_DIR)
        return env.started(f"umask 077\nmkdir -p {d} && chmod 700 {d} || exit 1\n{self._enter(env)}"
                           f"if {ours(f'{d}/{role}.pid')}; then echo 'already running' >&2; exit 3; fi\n"
                           f"{keep_host_output(role)} || exit 1\n"
                           f"setsid nohup {shlex.join(argv)} > {output_fifo(role)} 2>&1 < /dev/null &\n"
                           f"{started_at('$!')} > {d}/{role}.pid.start; echo $! > {d}/{role}.pid")

    def start_main(self, argv: Sequence[str], env: NodeEnv) -> Command:
        return self._start("main", argv, env)

    def start_vllm_on_main(self, argv: Sequence[str], env: NodeEnv) -> Command:
        return self._start("vllm", argv, env)

    def start_router(self, argv: Sequence[str], env: NodeEnv) -> Command:
        return self._start("router", argv, env)

    def run_in_env(self, argv: Sequence[str], env: NodeEnv, twin: bool = False) -> Command:
        return Command(f"{self._enter(env)}exec {shlex.join(argv)}")

    def alive(self, role: str) -> Command:
        return Command(ours(f"{shell_path(SERVE_STATE_DIR)}/{role}.pid"))

    def logs(self, role: str, lines: int, follow: bool) -> Command:
        # The kept log is <role>.log and, once its keeper rotated, the chunk before it in <role>.log.1; followed by
        # name across a rotation.
        log = kept_log(role)
        if follow:
            return Command(f"tail -n {lines} -F {log} 2>&1")
        return Command(f"if [ -e {log}.1 ]; then cat {log}.1 {log} 2>/dev/null | tail -n {lines}; "
                       f"else tail -n {lines} {log} 2>&1; fi")

    def stop_vllm(self) -> Command:
        d = shell_path(SERVE_STATE_DIR)
        return Command(f"{ours(f'{d}/vllm.pid')} && kill -TERM -- -$p 2>/dev/null && "
                       f"while kill -0 $p 2>/dev/null; do sleep 0.2; done; rm -f {d}/vllm.pid {d}/vllm.pid.start; true")

    def stop_main(self) -> Command:
        return Command(self._stop_roles("main") + "; true")

    def _stop_roles(self, roles: str) -> str:
        """Each of `roles` (a shell word list) stopped with its whole process group: TERM, the grace, then KILL."""
        d = shell_path(SERVE_STATE_DIR)
        grace = _wait_while("kill -0 \"$p\" 2>/dev/null", STOP_GRACE_S)
        gone = _wait_while("ps -o stat= -s \"$p\" 2>/dev/null | grep -qv '^Z'", KILL_WAIT_S)
        return (f"for r in {roles}; do if {ours(f'{d}/$r.pid')}; "
                f"then kill -TERM -- -\"$p\" 2>/dev/null; {grace}; kill -KILL -- -\"$p\" 2>/dev/null; {gone}; echo $r; fi; "
                f"rm -f {d}/$r.pid {d}/$r.pid.start; done")

    def stop_all(self) -> Command:
        # setsid made each process a group leader: signal the whole group (Ray's raylet, vLLM's workers). A SIGKILL
        # is not an exit: down returns once no process of the session still runs (seen: vLLM's API server still in
        # `ps` right after), so that a serve started next finds the node's memory free.
        ray = f"{shell_path(self.python_env or '/nonexistent')}/bin/ray"  # no env: no Ray of ours to stop
        raylet = "pgrep -u \"$(id -u)\" -f 'ray/core/src/ray/(raylet|gcs)' >/dev/null 2>&1"
        # Each keeper ends by itself once its process is gone and the last lines are kept; a stuck one is stopped.
        keepers = "; ".join(stop_keeper(role, KEEPER_STOP_S, host=True) for role in KEPT_ROLES)
        return Command(f"{self._stop_roles('router vllm main')}; "
                       f"if [ -x {ray} ] && {raylet}; then {ray} stop --force >/dev/null 2>&1; "
                       f"{_wait_while(raylet, KILL_WAIT_S)}; echo ray; fi; {keepers}; true")


def started_at(pid: str) -> str:
    """Shell printing when process `pid` started (its /proc stat's 22nd field, read after the name's closing
    parenthesis, which may hold spaces)."""
    return f"sed 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f20"


def ours(pid_file: str) -> str:
    """Shell that holds (setting $p) while the process `pid_file` names runs and is the one that was started: after a
    reboot the file outlives its process, and its number may be another process's, which only its start time tells
    apart (a file without one, from an older serve: the number alone)."""
    return (f"p=$(cat {pid_file} 2>/dev/null) && [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null && "
            f"{{ [ ! -e {pid_file}.start ] || [ \"$({started_at('$p')})\" = \"$(cat {pid_file}.start)\" ]; }}")


def _wait_while(condition: str, seconds: int) -> str:
    """Shell that polls `condition` every 0.2 s while it holds, for `seconds` at most."""
    return f"i=0; while {condition} && [ $i -lt {seconds * 5} ]; do sleep 0.2; i=$((i+1)); done"


@dataclass(frozen=True)
class RuntimeChoice:
    """Which runtime serves, and from what: set by the flags (or the head's record of the last serve), then
    completed by the image check with the head's image ID and entrypoint. A value: every use names its input."""

    name: RuntimeName
    image: str = DEFAULT_IMAGE
    docker_args: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] | None = None
    image_id: str | None = None  # the head's, once checked; None before the check (or with the host runtime)
    caches: bool = True  # the node's compile/JIT caches kept between serves (--no-cache-dirs: off, as eugr's)

    def with_image(self, head_image: ImageInfo) -> RuntimeChoice:
        return replace(self, entrypoint=head_image.entrypoint, image_id=head_image.id)

    def on(self, host: Host) -> Runtime:
        """How `host` starts, watches, reads and stops the serving processes. Only a start (and the serving env:
        the probe, Ray's members) needs the host runtime's python_env: status, logs, top and doctor --bundle work on
        a node bootstrapped for the host runtime before its vLLM environment exists."""
        if self.name == "docker":
            return DockerRuntime(self.image, self.entrypoint, self.docker_args, self.caches)
        env = host.vars.get("python_env")
        return HostRuntime(str(env) if env else None, self.caches, host.name)

    def check_starts(self, host: Host) -> None:
        """What starting an engine on `host` needs of the inventory (the host runtime: python_env), checked by what
        starts one (serve, up) before it connects: bad input, exit 2."""
        if self.name == "host" and not host.vars.get("python_env"):
            raise no_python_env(host.name)

    def start_fix(self) -> str:
        if self.name == "docker":
            return (f"check Docker on that node (docker ps) and the image {self.image}; "
                    "`sparkcluster down` clears leftovers")
        return "check python_env on that node holds ray and vllm; `sparkcluster down` clears leftovers"


def no_python_env(node: str) -> UsageError:
    return UsageError(f"{node}: the host runtime needs `python_env` (a virtual environment with ray and vllm) in "
                      "the inventory to start an engine", "set vars: {python_env: /path/to/venv}, or use --runtime docker")


def stop_all_serving(host: Host) -> Command:
    """Stops every kind of serving this tool starts (both runtimes), whatever the head's record says."""
    docker = DockerRuntime(DEFAULT_IMAGE).stop_all().script
    env = host.vars.get("python_env")
    return Command(f"if command -v docker >/dev/null 2>&1; then {docker}; fi; "
                   + HostRuntime(str(env) if env else "/nonexistent").stop_all().script)


FROM_FLAG = "from --runtime"


@dataclass(frozen=True)
class ClusterRuntime:
    """The runtime a command works with, and where that came from (shown beside the inventory's line)."""

    name: RuntimeName
    source: str

    def shown(self) -> str:
        return f"runtime: {self.name} ({self.source})"


def cluster_runtime(inventory: Inventory, given: RuntimeName | None) -> ClusterRuntime:
    """--runtime, else the inventory's `runtime` (which `bootstrap --runtime` records there), else docker. One
    cluster runs one runtime: hosts told different ones are bad input, before anything connects."""
    if given is not None:
        return ClusterRuntime(given, FROM_FLAG)
    told = {h.name: h.vars.get("runtime") for h in inventory.hosts}
    names = {str(v or "docker") for v in told.values()}
    if len(names) > 1:
        listing = ", ".join(f"{n}: {v or 'docker (unset)'}" for n, v in told.items())
        raise UsageError(f"{inventory.path}: the hosts are given different runtimes ({listing})",
                         "set `runtime:` once, in the inventory's vars, or pass --runtime")
    name = next(iter(names))
    if any(told.values()):
        return ClusterRuntime(_runtime_name(name), f"the inventory's runtime, in {inventory.path}")
    return ClusterRuntime("docker", "the default; `bootstrap --runtime host` records another in the inventory")


def cluster_launcher(inventory: Inventory) -> Launcher | None:
    """The inventory's `launcher` (ray or native, checked when it loaded), else None: serve's own choice."""
    told = inventory.head.vars.get("launcher")
    return next((name for name in LAUNCHERS if name == told), None)


def remember_runtime(inventory: Inventory, name: RuntimeName) -> bool:
    """Records the runtime bootstrap was told in the inventory's vars, so that every later command follows it;
    False when the inventory already runs it (docker: unset is docker, and stays unset)."""
    if cluster_runtime(inventory, None).name == name:
        return False
    return set_shared_var(inventory, "runtime", name)


def _runtime_name(text: str) -> RuntimeName:
    return next(name for name in RUNTIMES if name == text)  # checked when the inventory loaded
