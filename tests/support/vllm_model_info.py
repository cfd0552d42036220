"""vLLM's model-info cache, filled once per machine and laid on each simulated node before its first serve.

Before it builds a model, `vllm serve` inspects the model's class (does it support pipeline parallelism, which
interfaces it implements) in a subprocess that imports vLLM's model code again: ~11 s of CPU on this machine, paid
by every node's first serve (each node's own `vllm serve`, on a ring all of them at once on two cores). vLLM keeps
the answer in $VLLM_CACHE_ROOT/modelinfos/, keyed by a hash of the model's source file, and reads it back on the
next start: the first serve on a fresh simulated node always misses it. The answer depends on vLLM's code only
(not the node, the model's weights or the serve), so it is computed once here, with the same vLLM environment the
nodes run, and copied into both directories a node's vLLM reads it from (sparkcluster's cache directory, exported
by the host runtime, and vLLM's default one for --no-cache-dirs). A stale entry (another vLLM) is no harm: vLLM
checks the hash and inspects afresh.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
from pathlib import Path

from sparkcluster.serving.caches import CACHE_VARIABLES, NODE_CACHE_DIR
from sparkcluster.sim import SimCluster
from sparkcluster.sim.state import sim_root
from tests.support.helpers import ssh

ARCHITECTURE = "LlamaForCausalLM"  # the tiny Llama's (sparkcluster/sim/tinymodel.py)
INSPECT = f"""
from vllm.model_executor.models.registry import ModelRegistry
ModelRegistry.models[{ARCHITECTURE!r}].inspect_model_cls()
"""
NODE_DIRS = (f"{NODE_CACHE_DIR}/{CACHE_VARIABLES['VLLM_CACHE_ROOT'][0]}/modelinfos", "~/.cache/vllm/modelinfos")


def computed_once(vllm_env: Path) -> Path:
    """The cache file for ARCHITECTURE, made by `vllm_env`'s vLLM; two test processes share one computation."""
    root = sim_root() / "vllm-cache"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = [p for p in (root / "modelinfos").glob(f"*-{ARCHITECTURE}.json")]
        if not made:
            result = subprocess.run([str(vllm_env / "bin" / "python"), "-c", INSPECT], capture_output=True, text=True,
                                    timeout=300, env={**os.environ, "VLLM_CACHE_ROOT": str(root)})
            assert result.returncode == 0, result.stderr[-3000:]
            made = [p for p in (root / "modelinfos").glob(f"*-{ARCHITECTURE}.json")]
        assert len(made) == 1, made
        return made[0]


def lay_on(c: SimCluster, vllm_env: Path, hosts: list[str] | None = None) -> None:
    """Each node's login user finds vLLM's model info for the tiny Llama where its vLLM looks first."""
    cached = computed_once(vllm_env)
    dirs = " ".join(NODE_DIRS)
    targets = " ".join(f"{d}/{shlex.quote(cached.name)}" for d in NODE_DIRS)
    for host in hosts or [h.name for h in c.topology.hosts]:
        ssh(c, host, f"mkdir -p {dirs} && printf %s {shlex.quote(cached.read_text())} | tee {targets} > /dev/null "
                     f"&& chmod 600 {targets}")
