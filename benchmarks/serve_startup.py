"""Time from `sparkcluster serve` to the first completion on 2 simulated Sparks, for both launchers, and the
share of it spent in each phase (image check and copy, Ray bring-up, NCCL probe, vLLM launch, readiness).

Two runtimes, each with both launchers, each from a stopped cluster:
- docker: the vllm_node containers with a real Ray, PyTorch for the probe and the test image's stand-in vLLM
  (the first run also copies the 1.1 GB image to the worker over the fabric; the second finds it there);
- host: a real vLLM (CPU build, .venv-vllm from scripts/setup-vllm.sh) serving a tiny Llama, with the probe.

Then the compile/JIT caches (`--only caches` runs just this part): the host runtime serving the real CPU vLLM
with compilation on (no --enforce-eager: torch.compile and Inductor run at start-up), first with every node's
cache purged (`down --purge-caches`: cold), then again after `down` (warm: the caches kept in
~/.cache/sparkcluster/jit), and the warm/cold ratio of serve -> first completion.

Run as root:  .venv/bin/python benchmarks/serve_startup.py [--only docker|host|caches]
All figures come from this run: the real CLI (its own phase timings from --json), process start included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from sparkcluster.sim import SimCluster, UpOptions, image, tinymodel  # noqa: E402
from sparkcluster.sim.fakemodel import generate  # noqa: E402

VLLM_ENV = ROOT / ".venv-vllm"


def cli(inventory: Path, *args: str, config: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "sparkcluster", args[0], "-i", str(inventory), *args[1:]]  # -i before any `--`
    return subprocess.run(argv, capture_output=True,
                          text=True, env={**os.environ, "XDG_CONFIG_HOME": config}, timeout=900)


def timed_serve(inventory: Path, args: list[str], config: str) -> tuple[float, dict]:
    start = time.monotonic()
    result = cli(inventory, "serve", "--json", *args, config=config)
    wall = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"serve {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    cli(inventory, "down", config=config)
    time.sleep(5)  # a placement group stays reserved a few seconds after vLLM exits
    return wall, json.loads(result.stdout)


def report(label: str, wall: float, doc: dict) -> None:
    phases = doc["phases"]
    shares = ", ".join(f"{name} {seconds:.1f} s ({seconds / wall:.0%})" for name, seconds in phases.items())
    other = wall - sum(phases.values())
    print(f"{label}: serve -> first completion {wall:.1f} s: {shares}, connect+facts {other:.1f} s ({other / wall:.0%})")


def docker_runs(config: str) -> None:
    cluster = SimCluster.up(UpOptions(count=2, name="bench-serve-d"))
    try:
        assert cli(cluster.inventory_path, "bootstrap", config=config).returncode == 0
        tar = image.build("vllm-node", ray_env=ROOT / ".venv-ray")
        image.import_into(cluster, ["spark-1"], "vllm-node", tar)
        generate(cluster, "spark-1", "acme/tiny", 1 << 20, shards=1)
        for launcher in ("ray", "native"):
            wall, doc = timed_serve(cluster.inventory_path, ["--model", "acme/tiny", "--launcher", launcher], config)
            report(f"docker/{launcher} (stand-in vLLM)", wall, doc)
    finally:
        cluster.down()


def host_runs(config: str) -> None:
    cluster = SimCluster.up(UpOptions(count=2, name="bench-serve-h", docker=False, vllm_env=str(VLLM_ENV)))
    try:
        assert cli(cluster.inventory_path, "bootstrap", "--runtime", "host", config=config).returncode == 0
        # The Ray launcher runs the CPU vLLM with the simulator's plugin, which the inventory of `sim up` turns on.
        tinymodel.generate_on(cluster, "spark-1", str(VLLM_ENV / "bin" / "python"))
        for launcher in ("ray", "native"):
            wall, result = timed_serve(cluster.inventory_path, [
                "--runtime", "host", "--launcher", launcher, "--model", "local/tiny-llama", "--ready-timeout", "600",
                "--", "--max-model-len", "512", "--enforce-eager"], config)
            report(f"host/{launcher} (real vLLM CPU)", wall, result)
    finally:
        cluster.down()


def cache_runs(config: str) -> None:
    """serve -> first completion with compilation on, cold (caches purged) then warm, on one node (TP 1: the
    compile work is per node, and one node keeps the run within minutes on a small machine)."""
    cluster = SimCluster.up(UpOptions(count=1, name="bench-serve-c", docker=False, vllm_env=str(VLLM_ENV)))
    try:
        assert cli(cluster.inventory_path, "bootstrap", "--runtime", "host", config=config).returncode == 0
        tinymodel.generate_on(cluster, "spark-1", str(VLLM_ENV / "bin" / "python"))
        args = ["--runtime", "host", "--launcher", "native", "--model", "local/tiny-llama", "--ready-timeout", "900",
                "--no-verify", "--", "--max-model-len", "512"]
        cli(cluster.inventory_path, "down", "--purge-caches", config=config)
        cold, cold_doc = timed_serve(cluster.inventory_path, args, config)
        report("host/native, compilation on, cold caches", cold, cold_doc)
        status = cli(cluster.inventory_path, "status", "--json", config=config)
        size = json.loads(status.stdout)["nodes"]["spark-1"].get("cache_bytes", 0) if status.stdout else 0
        warm, warm_doc = timed_serve(cluster.inventory_path, args, config)
        report("host/native, compilation on, warm caches", warm, warm_doc)
        print(f"warm/cold serve -> first completion: {warm / cold:.2f} ({warm:.1f} s / {cold:.1f} s); "
              f"ready phase {warm_doc['phases']['ready'] / cold_doc['phases']['ready']:.2f}; "
              f"cache after the cold run {size / 1e6:.1f} MB")
    finally:
        cluster.down()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=("docker", "host", "caches"))
    only = parser.parse_args().only
    with tempfile.TemporaryDirectory() as config:
        if only in (None, "docker"):
            docker_runs(config)
        if not (VLLM_ENV / "bin" / "vllm").exists():
            print("host runs skipped: run scripts/setup-vllm.sh for a real vLLM")
            return 0
        if only in (None, "host"):
            host_runs(config)
        if only in (None, "caches"):
            cache_runs(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
