"""The nodes of a served cluster, as one command sees them: their comm env addresses, the runtime on each,
the image check, Ray membership, the start lines of Ray and vLLM, stopping, and the record of what runs
(kept on the head, so `status`, `logs` and `down` work from any machine)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.facts import HostFacts
from ..staging.images import ImageInfo, copy_from_head, inspect, plan_copies
from ..engine.inventory import Host, Inventory
from .launch import CONTAINER, DEFAULT_IMAGE, RAY_PORT, Node, ServeArgs, ray_start_argv, vllm_serve_argv
from ..engine.network import choose_for, comm_env_path
from ..engine.parallel import parallel_map
from .membership import MEMBERS_PY, judge_members, parse_members
from .runtime import DockerRuntime, HostRuntime, NodeEnv, Runtime
from ..engine.transport import Result, Transport, remote_path, Unreachable, openssh_argv, ssh_destination

STATE_FILE = ".config/sparkcluster/serve.json"  # on the head, relative to the login user's home
LOG_TAIL_LINES = 15


class Cluster:
    """The connected nodes of one command: their transports, facts, comm env and serving runtime."""

    def __init__(self, inventory: Inventory, transports: Mapping[str, Transport], facts: Mapping[str, HostFacts],
                 runtime: str, image: str = DEFAULT_IMAGE, docker_args: tuple[str, ...] = ()) -> None:
        self.inventory, self.transports, self.facts = inventory, transports, facts
        self.hosts = list(inventory.hosts)
        self.head = inventory.head
        self.runtime_name, self.image, self.docker_args = runtime, image, docker_args
        self.entrypoint: tuple[str, ...] | None = None
        self.image_id: str | None = None  # the head's, once checked
        self.nodes: dict[str, Node] = {}

    # ---- per node ----------------------------------------------------------------------------------
    def runtime(self, host: Host) -> Runtime:
        if self.runtime_name == "docker":
            return DockerRuntime(self.image, self.entrypoint, self.docker_args)
        env = host.vars.get("python_env")
        if not env:
            raise SparkclusterError(f"{host.name}: the host runtime needs `python_env` (a virtual environment with "
                                    "ray and vllm) in the inventory", "set vars: {python_env: /path/to/venv}, or "
                                    "use --runtime docker")
        return HostRuntime(str(env))

    def node_env(self, host: Host, extra: Mapping[str, str] | None = None) -> NodeEnv:
        env = {"HF_HUB_OFFLINE": "1"}  # the model was staged: never let vLLM download on a node (F15)
        for scope in (self.inventory.vars, host.vars):
            env.update({str(k): str(v) for k, v in (scope.get("serve_env") or {}).items()})
        env.update(extra or {})
        return NodeEnv(comm_env_path(host), env)

    def run(self, host: Host, line: str, timeout: float = 120) -> Result:
        return self.transports[host.name].run(Command(line, timeout=timeout))

    def each(self, fn: Callable[[Host], object]) -> list:
        return parallel_map(fn, self.hosts, workers=len(self.hosts), on_abort=self.close)

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

    # ---- facts ---------------------------------------------------------------------------------------
    def read_nodes(self) -> dict[str, Node]:
        """Each node's fabric address, as its comm env from bootstrap gives it to Ray and vLLM."""
        ips: dict[str, str] = {}
        for host in self.hosts:
            path = remote_path(comm_env_path(host))
            data = self.transports[host.name].read_file(path)
            values = dict(line.split("=", 1) for line in (data or b"").decode().splitlines()
                          if "=" in line and not line.startswith("#"))
            if "VLLM_HOST_IP" not in values:
                raise SparkclusterError(f"{host.name} has no comm env ({path} with VLLM_HOST_IP)",
                                        "run `sparkcluster bootstrap` first: it binds every comm variable to the QSFP link")
            ips[host.name] = values["VLLM_HOST_IP"]
        head_ip = ips[self.head.name]
        self.nodes = {h.name: Node(h.name, rank, ips[h.name], head_ip) for rank, h in enumerate(self.hosts)}
        return self.nodes

    def fabric_ips(self) -> dict[str, str]:
        return {h.name: choose_for(h, self.facts[h.name]).ip for h in self.hosts}

    def other_ips(self) -> dict[str, list[str]]:
        fabric = self.fabric_ips()
        return {h.name: [cidr.split("/")[0] for i in self.facts[h.name].interfaces for cidr in i.ipv4
                         if cidr.split("/")[0] != fabric[h.name]] + [h.address] for h in self.hosts}

    # ---- image ---------------------------------------------------------------------------------------
    def image_plan(self) -> tuple[ImageInfo, list[str]]:
        """The head's image and the nodes that need it copied; remembers its ID and entrypoint."""
        infos: dict[str, ImageInfo] = dict(zip((h.name for h in self.hosts),
                                               self.each(lambda h: inspect(self.transports[h.name], self.image))))
        need = plan_copies(infos, self.head.name, self.image)
        head_info = infos[self.head.name]
        self.entrypoint, self.image_id = head_info.entrypoint, head_info.id
        return head_info, need

    def sync_image(self, progress: Callable[[str, int, int], None]) -> list[str]:
        head_info, need = self.image_plan()
        fabric = self.fabric_ips()  # from the facts, not the comm env: the image goes over the QSFP link
        for name in need:  # one at a time: the head's disk and CPU feed every copy
            copy_from_head([*openssh_argv(self.head), ssh_destination(self.head)], self.image, self._user(name),
                           fabric[name], name, head_info.size, progress)
        for name in need:
            got = inspect(self.transports[name], self.image).id
            if got != head_info.id:
                raise SparkclusterError(f"{name} holds image {self.image} as {got}, not the head's {head_info.id}",
                                        f"remove it there (docker rmi {self.image}) and serve again")
        return need

    def _user(self, name: str) -> str:
        return next(h.user for h in self.hosts if h.name == name) or "root"

    # ---- Ray -----------------------------------------------------------------------------------------
    def ray_members(self, want: int, timeout: float) -> list:
        argv = ["python3", "-c", MEMBERS_PY, f"{self.nodes[self.head.name].ip}:{RAY_PORT}", str(want), str(timeout)]
        line = self.runtime(self.head).run_in_env(argv, self.node_env(self.head))
        result = self.run(self.head, line, timeout=timeout + 90)
        if not result.ok:
            raise SparkclusterError(f"asking Ray for its nodes failed on {self.head.name}: "
                                    f"{result.stderr_tail(3) or result.stdout.strip()[-300:]}",
                                    f"see `sparkcluster logs --node {self.head.name}`")
        return parse_members(result.stdout)

    def wait_ray(self, timeout: float) -> list:
        """Ray's members once every node joined (or the deadline passed), judged: an error names each problem."""
        members = self.ray_members(len(self.hosts), timeout)
        problems = judge_members(members, self.fabric_ips(), self.other_ips())
        if problems:
            raise SparkclusterError("the Ray cluster is not up as it must be:\n  " + "\n  ".join(problems),
                                    "fix the named nodes and run the command again (nothing was left running)")
        return members

    def ray_lines(self, recipe_env: Mapping[str, str]) -> dict[str, str]:
        """node -> the line that starts its Ray (eugr's `ray start`, detached)."""
        lines = {}
        for host in self.hosts:
            gpus = host.vars.get("ray_num_gpus")
            argv = ray_start_argv(self.nodes[host.name], int(gpus) if gpus is not None else None)
            lines[host.name] = self.runtime(host).start_main(argv, self.node_env(host, recipe_env))
        return lines

    def vllm_lines(self, launcher: str, args: ServeArgs) -> dict[str, str]:
        """node -> the line that starts its vLLM: the head's only with Ray, every node's (rank order) without."""
        nnodes = len(self.hosts)
        if launcher == "ray":
            argv = vllm_serve_argv(args, "ray", self.nodes[self.head.name], nnodes)
            return {self.head.name: self.runtime(self.head).start_vllm_on_main(argv, self.node_env(self.head, args.env))}
        return {h.name: self.runtime(h).start_main(vllm_serve_argv(args, "native", self.nodes[h.name], nnodes),
                                                   self.node_env(h, args.env)) for h in self.hosts}

    def start(self, lines: Mapping[str, str], what: str) -> None:
        """Run start lines: the head's first (the others connect to it), then the rest in parallel."""
        def one(host: Host) -> None:
            result = self.run(host, lines[host.name])
            if not result.ok:
                raise SparkclusterError(f"starting {what} on {host.name} failed (exit {result.exit_code}): "
                                        f"{result.stderr_tail(3)}", _start_fix(self.runtime_name, self.image))
        hosts = [h for h in self.hosts if h.name in lines]
        one(hosts[0])
        if hosts[1:]:
            parallel_map(one, hosts[1:], workers=len(hosts) - 1, on_abort=self.close)

    def current(self, host: Host) -> str:
        """Exit 0 when the node's Ray runs, and in a container of the image just checked: one started from
        an older image is not reused."""
        alive = self.runtime(host).alive("main")
        if self.runtime_name != "docker" or not self.image_id:
            return alive
        return f"{alive} && test \"$(docker inspect -f '{{{{.Image}}}}' {CONTAINER})\" = {self.image_id}"

    def gone(self, launcher: str) -> str | None:
        """Why the server cannot answer any more, or None while its processes run."""
        checks = [(h, "main") for h in self.hosts] + ([(self.head, "vllm")] if launcher == "ray" else [])
        for host, role in checks:
            try:
                if not self.run(host, self.runtime(host).alive(role), timeout=30).ok:
                    what = "vLLM" if role == "vllm" or launcher == "native" else "Ray"
                    return f"{what} on {host.name} exited"
            except Unreachable as e:
                return f"{host.name} is unreachable ({e.message})"
        return None

    def diagnosis(self, launcher: str) -> str:
        """The last lines of the head's vLLM log and what they show."""
        role = "vllm" if launcher == "ray" else "main"
        try:
            result = self.run(self.head, self.runtime(self.head).logs(role, 200, False), timeout=30)
            lines = result.stdout.strip().splitlines()
        except Unreachable as e:
            return f"{self.head.name} is unreachable: {e.message}"
        hints = []
        waiting = [line for line in lines if "placement group" in line.lower()]
        if waiting:
            hints.append("Ray is waiting for a placement group: a node lacks a GPU in Ray, or joined on an address "
                         "vLLM does not use (check `sparkcluster status`): " + waiting[-1].strip())
        tail = "\n    ".join(lines[-LOG_TAIL_LINES:]) or "(empty)"
        return "; ".join(hints + [f"last lines of the vLLM log on {self.head.name}:\n    {tail}"])

    # ---- stopping ------------------------------------------------------------------------------------
    def stop_line(self, host: Host) -> str:
        """Stops every kind of serving this tool starts (both runtimes), whatever the state file says."""
        lines = [f"if command -v docker >/dev/null 2>&1; then {DockerRuntime(self.image).stop_all()}; fi"]
        env = host.vars.get("python_env")
        lines.append(HostRuntime(str(env) if env else "/nonexistent").stop_all())
        return "; ".join(lines)

    def stop_everywhere(self) -> dict[str, str]:
        """node -> what was stopped ("" for nothing) or why it could not be reached."""
        def stop(host: Host) -> tuple[str, str]:
            try:
                # A failed phase may have closed every connection to interrupt its threads: open a new one.
                self.transports[host.name].reconnect()
                result = self.run(host, self.stop_line(host), timeout=60)
                return host.name, " ".join(result.stdout.split()) if result.ok else f"failed: {result.stderr_tail(2)}"
            except Unreachable as e:
                return host.name, f"unreachable: {e.message}"
        return dict(parallel_map(stop, self.hosts, workers=len(self.hosts)))

    # ---- state ---------------------------------------------------------------------------------------
    def write_state(self, doc: dict) -> None:
        transport = self.transports[self.head.name]
        transport.run(Command("mkdir -p .config/sparkcluster"))
        transport.write_file_atomic(STATE_FILE, json.dumps(doc, indent=2).encode(), 0o644)

    def read_state(self) -> dict | None:
        data = self.transports[self.head.name].read_file(STATE_FILE)
        return json.loads(data) if data else None

    def clear_state(self) -> None:
        try:
            self.transports[self.head.name].run(Command(f"rm -f {STATE_FILE}"))
        except Unreachable:
            pass  # nothing runs on a head that cannot be reached; its stale record is overwritten next time

    def endpoint(self, port: int) -> str:
        return f"http://{self.head.address}:{port}/v1"


def _start_fix(runtime: str, image: str) -> str:
    if runtime == "docker":
        return f"check Docker on that node (docker ps) and the image {image}; `sparkcluster down` clears leftovers"
    return "check python_env on that node holds ray and vllm; `sparkcluster down` clears leftovers"
