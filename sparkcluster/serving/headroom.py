"""Unified-memory headroom on GB10: the two serve settings the field found taking whole hosts down, held to the bounds
of node/memory_bounds.py (why they bite, and the threads that found them, are there). serve refuses either above its
bound (exit 2, before anything connects) unless `--force` is given, which lets it through with a warning. Checked
once, on the final values: vLLM's flags as the recipe, `--set` and the extra arguments after `--` merged them, and the
`docker run` arguments as given with `--docker-arg`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..engine.errors import UsageError
from ..node.memory_bounds import (
    GPU_MEMORY_SOURCE,
    MAX_GPU_MEMORY_UTILIZATION,
    MAX_SHM_BYTES,
    MAX_SHM_TEXT,
    SHM_SOURCE,
    shm_bytes,
)
from ..recipes.command import canonical, flag_words


@dataclass(frozen=True)
class Breach:
    """A setting above its bound: what was asked, why it is refused (with the thread that says so), and the fix."""

    setting: str  # as given: "--gpu-memory-utilization 0.95", "--shm-size=64g"
    why: str
    fix: str

    def message(self) -> str:
        return f"{self.setting} {self.why}"


def gpu_memory_breach(vllm_flags: Sequence[str]) -> Breach | None:
    """vLLM's share above MAX_GPU_MEMORY_UTILIZATION, by any spelling vLLM reads (`--gpu_memory_utilization`)."""
    flags = {canonical(flag): value for flag, value in flag_words(list(vllm_flags), "the vLLM flags").items()}
    value = flags.get("--gpu-memory-utilization")
    try:
        share = float(value) if isinstance(value, str) else None
    except ValueError:
        share = None  # not a number: vLLM refuses it itself
    if share is None or share <= MAX_GPU_MEMORY_UTILIZATION:
        return None
    return Breach(f"--gpu-memory-utilization {value}",
                  f"is above {MAX_GPU_MEMORY_UTILIZATION:.2f}: on GB10 the GPU's share comes out of the unified memory "
                  f"the OS runs in, and at 0.95 hosts froze until power-cycled ({GPU_MEMORY_SOURCE})",
                  f"give --gpu-memory-utilization {MAX_GPU_MEMORY_UTILIZATION:.2f} or lower (after --, or with --set "
                  "where the recipe's template takes it), or shorten --max-model-len; --force serves it anyway")


def shm_breach(docker_args: Sequence[str]) -> Breach | None:
    """A `--shm-size` among the `docker run` arguments above MAX_SHM_BYTES (`--shm-size=64g` or `--shm-size 64g`;
    Docker takes the last one given)."""
    found: tuple[str, str] | None = None
    for i, word in enumerate(docker_args):
        if word.startswith("--shm-size="):
            found = (word, word.split("=", 1)[1])
        elif word == "--shm-size" and i + 1 < len(docker_args):
            found = (f"--shm-size {docker_args[i + 1]}", docker_args[i + 1])
    if found is None:
        return None
    size = shm_bytes(found[1])
    if size is None or size <= MAX_SHM_BYTES:
        return None  # unreadable: Docker refuses it itself
    return Breach(found[0], f"is above {MAX_SHM_TEXT}: on GB10 /dev/shm is a tmpfs carved out of the same unified "
                            f"memory the GPU allocates from ({SHM_SOURCE})",
                  f"give --docker-arg=--shm-size=10g (or at most {MAX_SHM_TEXT}); --force serves it anyway")


def breaches(vllm_flags: Sequence[str], docker_args: Sequence[str]) -> tuple[Breach, ...]:
    return tuple(b for b in (gpu_memory_breach(vllm_flags), shm_breach(docker_args)) if b is not None)


def hold(vllm_flags: Sequence[str], docker_args: Sequence[str], force: bool) -> tuple[str, ...]:
    """UsageError (exit 2) for the first setting above its bound; with `force`, the warnings to print instead."""
    found = breaches(vllm_flags, docker_args)
    if found and not force:
        raise UsageError(found[0].message(), found[0].fix)
    return tuple(f"{b.message()}; served anyway (--force)" for b in found)
