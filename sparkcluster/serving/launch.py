"""The command lines of a served cluster, as values: Ray's start commands, the vllm_node container, and
`vllm serve` for both launchers, as eugr's launcher writes them. Pure functions: tests compare
them with eugr's exact lines."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from ..engine.remote import HF_HOME
from ..nccl.tunerplugin import container_mount
from .caches import docker_cache_args, make_dir_line

# How the serving processes run on a node: in eugr's vllm_node container, or from the inventory's python_env.
RuntimeName = Literal["docker", "host"]
# How vLLM spans the nodes: over a Ray cluster (eugr's setup), or vLLM's own --nnodes multi-node mode.
Launcher = Literal["ray", "native"]
RUNTIMES: tuple[RuntimeName, ...] = get_args(RuntimeName)
LAUNCHERS: tuple[Launcher, ...] = get_args(Launcher)
CONTAINER = "vllm_node"
DEFAULT_IMAGE = "vllm-node"
RAY_PORT = 6379
DASHBOARD_PORT = 8265
DASHBOARD_HOST = "127.0.0.1"
DEFAULT_VLLM_PORT = 8000
NATIVE_MASTER_PORT = 29501  # eugr's default master port for vLLM's own multi-node mode (no Ray)
CONTAINER_HF_HOME = "/root/.cache/huggingface"
# Resolved by the node's own shell, never from local values (F14).
NODE_HF_HOME = f'"{HF_HOME}"'


@dataclass(frozen=True)
class Node:
    """One serving node: its inventory name, its rank (the head is 0) and the fabric addresses from its
    comm env."""

    name: str
    rank: int
    ip: str  # this node's QSFP address (VLLM_HOST_IP)
    head_ip: str

    @property
    def is_head(self) -> bool:
        return self.rank == 0


def ray_start_argv(node: Node, num_gpus: int | None = None) -> list[str]:
    """eugr's run-cluster-node.sh `exec ray start` lines, in the foreground (--block) so the container or
    process lives exactly as long as Ray does. `num_gpus` only where Ray cannot detect the GPU itself."""
    if node.is_head:
        # eugr's line but for one word: his dashboard listens on 0.0.0.0, and Ray's dashboard takes jobs (code to
        # run on every node) from anyone who reaches it, with no key. On the head's loopback it is reached as his
        # notes reach it anyway, through an SSH tunnel (`ssh -L 8265:127.0.0.1:8265 HEAD`).
        argv = ["ray", "start", "--block", "--head", "--port", str(RAY_PORT), "--node-ip-address", node.ip,
                "--include-dashboard=True", "--dashboard-host", DASHBOARD_HOST, "--dashboard-port", str(DASHBOARD_PORT),
                "--disable-usage-stats"]
    else:
        argv = ["ray", "start", "--block", f"--address={node.head_ip}:{RAY_PORT}", "--node-ip-address", node.ip]
    if num_gpus is not None:
        argv += ["--num-gpus", str(num_gpus)]
    return argv


@dataclass(frozen=True)
class ServeArgs:
    """What `vllm serve` is asked to do, before the launcher adds its own flags."""

    model: str  # repo id as vLLM resolves it in the HF cache
    tp: int
    pp: int = 1  # pipeline stages: TP x PP = the nodes, one GPU each (eugr's 3-node recipes run TP 1 x PP 3)
    port: int = DEFAULT_VLLM_PORT
    served_name: str | None = None
    flags: tuple[str, ...] = ()  # recipe flags merged with the user's extra args
    env: Mapping[str, str] = field(default_factory=dict)  # recipe environment (e.g. VLLM_USE_FLASHINFER_...)
    host: str = "0.0.0.0"  # where its API server listens: a guarded replica's is the node's loopback (router.py)


def vllm_serve_argv(args: ServeArgs, launcher: Launcher, node: Node, nnodes: int) -> list[str]:
    """`vllm serve` for one node. ray: only the head runs it; native: every node runs one, the workers
    headless (vLLM's own multi-node mode, as eugr's and sparkrun's current releases default to); native on one
    node: vLLM alone, with no launcher flag (as eugr's solo mode and sparkrun on one host run it)."""
    argv = ["vllm", "serve", args.model, "--tensor-parallel-size", str(args.tp)]
    if args.pp > 1:
        argv += ["--pipeline-parallel-size", str(args.pp)]
    if launcher == "ray":
        argv += ["--distributed-executor-backend", "ray"]
    elif nnodes > 1:
        argv += ["--distributed-executor-backend", "mp", "--nnodes", str(nnodes), "--node-rank", str(node.rank),
                 "--master-addr", node.head_ip, "--master-port", str(NATIVE_MASTER_PORT)]
        if not node.is_head:
            return argv + ["--headless", *args.flags]
    argv += ["--host", args.host, "--port", str(args.port)]
    if args.served_name:
        argv += ["--served-model-name", args.served_name]
    return argv + list(args.flags)


def serves_by_entrypoint(entrypoint: Sequence[str] | None) -> bool:
    """Images such as vllm/vllm-openai start `vllm serve` themselves: they take only the model and flags
    (given the full command they fail with `unrecognized arguments: serve`). NVIDIA's images have a wrapper
    entrypoint that execs the command it is given."""
    words = list(entrypoint or [])
    return words[-2:] == ["vllm", "serve"] or any("vllm.entrypoints" in w for w in words)


def container_command(argv: Sequence[str], entrypoint: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(docker run options, command) to run `argv` as the container's main process whatever the image's
    entrypoint: a `vllm serve` entrypoint keeps `vllm serve` argv minus its first two words, and is
    replaced for anything else (Ray); a wrapper entrypoint is kept, since it may set up CUDA compatibility."""
    if not serves_by_entrypoint(entrypoint):
        return [], list(argv)
    if list(argv[:2]) == ["vllm", "serve"]:
        return [], list(argv[2:])
    return ["--entrypoint", argv[0]], list(argv[1:])


def docker_run_line(image: str, env_file: str, argv: Sequence[str], *, entrypoint: Sequence[str] | None = None,
                    env: Mapping[str, str] | None = None, docker_args: Sequence[str] = (),
                    detached: bool = True, caches: bool = False, pass_env: Sequence[str] = ()) -> str:
    """eugr's `docker run` for vllm_node (§1.4), with this node's own comm env from bootstrap as an env file
    rather than the head's values passed to every node. A shell line: the env file and the HF cache are
    paths the node's shell resolves. `detached=False`: a short-lived twin with the same flags, in the
    foreground (the probe, before the native launcher's containers exist). `caches`: the node's compile and JIT
    cache directory mounted and every library pointed into it (before the recipe's env, which may override). Where
    verify --tune kept a choice per size, the tuner plugin's folder is mounted too, at the node's own path (its
    comm env names it there); on any other node that word expands to nothing, and the line runs as eugr's."""
    options, command = container_command(argv, entrypoint)
    mode = ["-d", "--privileged", "--gpus", "all", "--rm"] if detached else ["--rm", "-i", "--privileged", "--gpus", "all"]
    fixed = ["docker", "run", *mode, "--ipc=host", "--network", "host"] + (["--name", CONTAINER] if detached else [])
    extra_env = [a for k, v in sorted((env or {}).items()) for a in ("-e", f"{k}={v}")]
    extra_env += [a for name in sorted(pass_env) for a in ("-e", name)]  # values from the client's environment
    cache = f"{docker_cache_args()} " if caches else ""
    line = (f"{shlex.join(fixed)} --env-file {env_file} {cache}{shlex.join(extra_env)} "
            f"-v {NODE_HF_HOME}:{CONTAINER_HF_HOME}{container_mount(env_file)} "
            f"{shlex.join([*docker_args, *options, image, *command])}")
    return f"{make_dir_line()} && {line}" if caches else line
