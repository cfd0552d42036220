"""Benchmark profiles in the Spark Arena's YAML (sparkrun's `benchmarking/*.yaml`): `framework` (llama-benchy),
`args` (pp, tg, depth, concurrency as lists; runs; prefix_caching or enable_prefix_caching) and an optional
`schedule` of {depth, concurrency} cells that sets the order (else depth-major over the args). `arena-v2` is the
Spark Arena v2 profile, built in: pp 2048, tg 128, seven depths to 100000, concurrency 1/2/5/10, 3 runs, prefix
caching, in the Arena's heat-aware order (the published schedule, bucket_43521_seed42).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ....engine.errors import UsageError

ARENA_V2_NAME = "@official/spark-arena-v2"  # how sparkrun names it: metadata.json's benchmark.profile
ARENA_V2_DEPTHS = (0, 4096, 8192, 16384, 32768, 65535, 100000)
ARENA_V2_SCHEDULE: tuple[tuple[int, int], ...] = (  # (depth, concurrency), the Arena's published order
    (8192, 5), (4096, 5), (8192, 10), (8192, 2), (4096, 2), (100000, 5), (100000, 2), (65535, 10), (65535, 1),
    (0, 1), (65535, 5), (32768, 2), (4096, 10), (16384, 1), (8192, 1), (32768, 5), (0, 10), (16384, 10),
    (32768, 1), (0, 5), (16384, 5), (100000, 1), (32768, 10), (16384, 2), (0, 2), (65535, 2), (4096, 1),
    (100000, 10),
)
KNOWN_ARGS = {"pp", "tg", "depth", "concurrency", "runs", "prefix_caching", "enable_prefix_caching",
              "latency_mode", "no_cache", "skip_coherence", "no_warmup", "adapt_prompt", "no_adapt_prompt",
              "tokenizer", "book_url"}


@dataclass(frozen=True)
class Profile:
    name: str  # what metadata.json names it
    description: str
    pp: tuple[int, ...]
    tg: tuple[int, ...]
    depth: tuple[int, ...]
    concurrency: tuple[int, ...]
    runs: int
    prefix_caching: bool
    latency_mode: str = "api"
    schedule: tuple[tuple[int, int], ...] = ()  # (depth, concurrency) in order; () = depth-major over args
    args: dict[str, Any] = field(default_factory=dict)  # as the profile gave them, for metadata.json

    def order(self) -> list[tuple[int, int]]:
        return list(self.schedule) or [(d, c) for d in self.depth for c in self.concurrency]


ARENA_V2 = Profile(ARENA_V2_NAME, "Spark Arena Benchmark Profile v2", (2048,), (128,), ARENA_V2_DEPTHS,
                   (1, 2, 5, 10), 3, True, schedule=ARENA_V2_SCHEDULE,
                   args={"depth": list(ARENA_V2_DEPTHS), "pp": [2048], "tg": [128], "concurrency": [1, 2, 5, 10],
                         "prefix_caching": True, "runs": 3})
BUILT_IN = {"arena-v2": ARENA_V2, "spark-arena-v2": ARENA_V2, ARENA_V2_NAME: ARENA_V2}


def _ints(value: object, key: str, where: str, least: int) -> tuple[int, ...]:
    items = value if isinstance(value, list) else [value]
    if not items or any(isinstance(v, bool) or not isinstance(v, int) or v < least for v in items):
        raise UsageError(f"{where}: args.{key} is {value!r}, not a list of whole numbers >= {least}",
                         f"e.g. {key}: [{max(least, 1)}]")
    return tuple(items)


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a profile file in the Arena's YAML; UsageError names what is wrong."""
    if name_or_path in BUILT_IN:
        return BUILT_IN[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise UsageError(f"--profile {name_or_path}: no such built-in profile or file",
                         f"give one of {', '.join(sorted(BUILT_IN))}, or a profile YAML file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise UsageError(f"{where}: not a readable YAML profile ({str(e).splitlines()[0]})",
                         "fix the YAML (sparkrun's benchmarking/*.yaml format)") from None
    return parse_profile(doc, str(path))


def parse_profile(doc: object, where: str) -> Profile:
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: a profile is a mapping (framework, args, schedule)", "see spark-arena-v2.yaml")
    framework = doc.get("framework", "llama-benchy")
    if framework != "llama-benchy":
        raise UsageError(f"{where}: framework {framework!r} is not llama-benchy",
                         "bench runs llama-benchy profiles only")
    args = doc.get("args") or {}
    if not isinstance(args, dict):
        raise UsageError(f"{where}: args is not a mapping", "e.g. args: {pp: [2048], tg: [128]}")
    unknown = sorted(set(args) - KNOWN_ARGS)
    if unknown:
        raise UsageError(f"{where}: args {', '.join(unknown)} are not llama-benchy flags bench knows",
                         f"use {', '.join(sorted(KNOWN_ARGS))}")
    pp = _ints(args.get("pp", [2048]), "pp", where, 1)
    tg = _ints(args.get("tg", [32]), "tg", where, 1)
    depth = _ints(args.get("depth", [0]), "depth", where, 0)
    concurrency = _ints(args.get("concurrency", [1]), "concurrency", where, 1)
    runs = _ints(args.get("runs", 3), "runs", where, 1)[0]
    prefix = bool(args.get("prefix_caching", args.get("enable_prefix_caching", False)))
    latency_mode = str(args.get("latency_mode", "api"))
    if latency_mode not in ("api", "generation", "none"):
        raise UsageError(f"{where}: args.latency_mode {latency_mode!r}", "api, generation or none")
    schedule = doc.get("schedule") or []
    if not isinstance(schedule, list):
        raise UsageError(f"{where}: schedule is not a list", "e.g. schedule: [{depth: 0, concurrency: 1}]")
    cells: list[tuple[int, int]] = []
    for index, entry in enumerate(schedule):
        d = entry.get("depth") if isinstance(entry, dict) else None
        c = entry.get("concurrency") if isinstance(entry, dict) else None
        if not isinstance(d, int) or not isinstance(c, int) or d < 0 or c < 1:
            raise UsageError(f"{where}: schedule entry {index + 1} is {entry!r}",
                             "each entry is {depth: N, concurrency: C}")
        cells.append((d, c))
    metadata = doc.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    return Profile(where, str(metadata.get("description", "")), pp, tg, depth, concurrency, runs, prefix,
                   latency_mode, tuple(cells), dict(args))


def consolidate(per_cell: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Cells merged as sparkrun merges them: {model, max_concurrency, benchmarks} (model from the first)."""
    model = next((str(d.get("model", "")) for d in per_cell), "")
    benchmarks = [b for d in per_cell for b in d.get("benchmarks", [])]
    return {"model": model, "max_concurrency": max((int(b["concurrency"]) for b in benchmarks), default=0),
            "benchmarks": benchmarks}
