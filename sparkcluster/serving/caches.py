"""The compile and JIT caches a node keeps between serves: one directory per node, mounted into every serving
container and exported to the host runtime's processes, so a restart finds what the last boot compiled (a tuned
recipe's first boot spends up to ~30 min in torch.compile, Inductor, Triton, FlashInfer and CuTeDSL; a warm one
3-5 min). Each library keys its own entries by content (model, flags, library versions, GPU), so one directory
serves every model and image; a stale entry is never used, only kept.

Every library is pointed at its directory by its own variable rather than through XDG_CACHE_HOME or $HOME:
Inductor writes to /tmp/torchinductor_$USER, Triton and FlashInfer expand ~ themselves (~/.triton, ~/.cache/
flashinfer) and CuTeDSL writes under /tmp, so none of them would land in a mounted ~/.cache on their own.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from ..engine.command import Command, shell_path

NODE_CACHE_DIR = "~/.cache/sparkcluster/jit"  # on each node, relative to the login user's home
CONTAINER_CACHE_DIR = "/root/.cache/sparkcluster-jit"  # where the vllm_node container sees it

# variable -> (sub-directory, the library and why its variable is needed)
CACHE_VARIABLES: Mapping[str, tuple[str, str]] = {
    "VLLM_CACHE_ROOT": ("vllm", "vLLM: torch.compile artefacts (torch_compile_cache) and its other caches; "
                                "default ~/.cache/vllm"),
    "TORCHINDUCTOR_CACHE_DIR": ("inductor", "PyTorch Inductor: generated kernels and FX graph cache; default "
                                            "/tmp/torchinductor_$USER, outside any home mount"),
    "TRITON_CACHE_DIR": ("triton", "Triton: compiled kernels; default ~/.triton/cache, expanded by Triton itself "
                                   "(ignores XDG_CACHE_HOME)"),
    "FLASHINFER_WORKSPACE_BASE": ("flashinfer", "FlashInfer: JIT-built ops under <base>/.cache/flashinfer; "
                                                "default base is the home directory"),
    "CUTE_DSL_CACHE_DIR": ("cutedsl", "CUTLASS CuTeDSL: compiled kernels (CUTLASS >= 4.3.2); default under /tmp"),
    "CUDA_CACHE_PATH": ("nv", "the CUDA driver's PTX JIT cache; default ~/.nv/ComputeCache"),
}


def cache_env(root: str) -> dict[str, str]:
    """Each variable's directory under `root` (a path as the process sees it)."""
    return {name: f"{root}/{sub}" for name, (sub, _) in CACHE_VARIABLES.items()}


def docker_cache_args() -> str:
    """`-v` and `-e` words for `docker run`: the node's directory (resolved by the node's shell) at a fixed place
    in the container, each library pointed into it."""
    env = [w for k, v in cache_env(CONTAINER_CACHE_DIR).items() for w in ("-e", f"{k}={v}")]
    return f"-v {shell_path(NODE_CACHE_DIR)}:{CONTAINER_CACHE_DIR} {shlex.join(env)}"


def make_dir_line() -> str:
    """Created by the login user before Docker would create it as root (the host runtime must write there too)."""
    return f"mkdir -p {shell_path(NODE_CACHE_DIR)}"


def host_exports() -> str:
    """The `export` line for the host runtime: the node's own directory, expanded by the node's shell."""
    base = shell_path(NODE_CACHE_DIR)
    return "export " + " ".join(f"{k}={base}/{sub}" for k, (sub, _) in CACHE_VARIABLES.items())


def size_command() -> Command:
    """Prints the node's cache size in KiB (0 where there is none yet)."""
    d = shell_path(NODE_CACHE_DIR)
    return Command(f"if [ -d {d} ]; then du -sk {d} 2>/dev/null | cut -f1; else echo 0; fi", timeout=60)


def purge_command(image: str) -> Command:
    """Removes the node's cache; prints the KiB it held. What the root container wrote cannot be removed by a login
    user who is not root: the rest goes from inside a short-lived container of the serving image (as root)."""
    d = shell_path(NODE_CACHE_DIR)
    as_root = (f"docker run --rm --entrypoint sh -v {d}:/purge {shlex.quote(image)} "
               "-c 'rm -rf /purge/* /purge/.[!.]* 2>/dev/null; true' >/dev/null")
    return Command(f"s=$({size_command().script}); rm -rf {d} 2>/dev/null || "
                   f"{{ command -v docker >/dev/null 2>&1 && {as_root}; rm -rf {d}; }}; "
                   f"if [ -e {d} ]; then echo 'some files remain' >&2; exit 1; fi; echo \"$s\"", timeout=300)


def parse_size(text: str) -> int | None:
    """size_command's output (KiB) as bytes, or None where it printed something else."""
    lines = text.strip().splitlines()
    word = lines[-1].strip() if lines else ""
    return int(word) * 1024 if word.isdigit() else None
