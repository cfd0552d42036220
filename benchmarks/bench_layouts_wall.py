"""Where the wall time of `bench --layouts` goes: staging the model once, serving each layout (serve's own phases)
and measuring it (bench's sweep), as shares of the command's wall time, from the timings bench --layouts records in
its JSON (`wall_s`, and `serve_s`, `measure_s` and `phases` per layout). Then the same command again: the resumed
run serves and measures nothing, and its wall time against the first run's is what a run cut short after its last
layout saves.

Two ways to run it:
- on a document already measured:  .venv/bin/python benchmarks/bench_layouts_wall.py FILE
  (the --json output of `bench --layouts`, or the layouts.json it leaves in --out DIR; no resume then);
- from scratch, as root, on 2 simulated Sparks with the real CPU vLLM (.venv-vllm from scripts/setup-vllm.sh):
  .venv/bin/python benchmarks/bench_layouts_wall.py [--layouts tp,replicas]
All figures come from this run's own documents.
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

from sparkcluster.sim import SimCluster, UpOptions, tinymodel  # noqa: E402

VLLM_ENV = ROOT / ".venv-vllm"
PROFILE = ["--concurrency", "1,4", "--runs", "1", "--requests-per-stream", "2", "--prompt-tokens", "32",
           "--output-tokens", "16", "--model", "local/tiny-llama", "--ready-timeout", "600"]
VLLM_FLAGS = ["--", "--max-model-len", "256", "--enforce-eager"]


def split(doc: dict, wall: float | None) -> None:
    """The document's timings, each as a share of the wall (the command's, else the sum of its parts)."""
    parts = doc["wall_s"]
    whole = wall or sum(parts.values())
    print(f"bench --layouts {','.join(m['layout'] for m in doc['layouts'])}: {whole:.1f} s"
          + ("" if wall else " (the sum of its parts: no wall time measured here)"))
    for name in ("stage", "serve", "measure"):
        print(f"  {name:8} {parts[name]:7.1f} s  {parts[name] / whole:6.1%}")
    if wall:
        other = wall - sum(parts.values())
        print(f"  {'other':8} {other:7.1f} s  {other / whole:6.1%}  (start-up, connecting, facts, the table)")
    for layout in doc["layouts"]:
        phases = ", ".join(f"{name} {seconds:.1f}" for name, seconds in layout["phases"].items())
        print(f"  {layout['layout']:9} serve {layout['serve_s']:6.1f} s ({phases}), measure {layout['measure_s']:6.1f} s;"
              f" measure/serve {layout['measure_s'] / layout['serve_s']:.2f}")
    if doc.get("cpu_vllm"):
        print(f"  note: {doc['cpu_vllm']}")


def timed(inventory: Path, args: list[str], config: str) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "sparkcluster", "bench", "-i", str(inventory), *args]
    start = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                            env={**os.environ, "XDG_CONFIG_HOME": config})
    wall = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"bench {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return wall, json.loads(result.stdout)


def from_scratch(layouts: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        config, out = f"{scratch}/config", f"{scratch}/out"
        cluster = SimCluster.up(UpOptions(count=2, name="bench-layouts", docker=False, vllm_env=str(VLLM_ENV)))
        try:
            bootstrap = subprocess.run([sys.executable, "-m", "sparkcluster", "bootstrap", str(cluster.inventory_path)],
                                       capture_output=True, text=True, env={**os.environ, "XDG_CONFIG_HOME": config})
            assert bootstrap.returncode == 0, bootstrap.stderr[-2000:]
            tinymodel.generate_on(cluster, "spark-1", str(VLLM_ENV / "bin" / "python"))
            args = ["--layouts", layouts, "--out", out, "--json", *PROFILE, *VLLM_FLAGS]
            wall, doc = timed(cluster.inventory_path, args, config)
            split(doc, wall)
            again, _ = timed(cluster.inventory_path, args, config)
            print(f"  resumed with every layout measured: {again:.1f} s, {again / wall:.3f} of the first run")
        finally:
            subprocess.run([sys.executable, "-m", "sparkcluster", "down", "-i", str(cluster.inventory_path)],
                           capture_output=True, env={**os.environ, "XDG_CONFIG_HOME": config})
            cluster.down()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("file", nargs="?", type=Path, help="a bench --layouts --json document")
    parser.add_argument("--layouts", default="tp,replicas")
    args = parser.parse_args()
    if args.file:
        split(json.loads(args.file.read_text()), None)
        return 0
    if not (VLLM_ENV / "bin" / "vllm").exists():
        print("run scripts/setup-vllm.sh first: the layouts are served by a real (CPU) vLLM")
        return 1
    from_scratch(args.layouts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
