"""verify --tune's choice per message size, through sparkcluster's NCCL tuner plugin, on a GPU host (issue 50).
GPU-only and opt-in, run by hand from the repository root (sparkcluster importable: PYTHONPATH=.):

    python3 tests/device/tuner_plugin.py [--same-gpu] [--hidden-size 4096] [--concurrency 1,8]

1. builds sparkcluster/nccl/tuner/sizes_tuner.c with the host's `cc`, as verify --tune does on each node;
2. proves the plugin steers NCCL: a table forcing Ring + LL at every size must load ("Successfully loaded external
   tuner plugin" in NCCL's log, the plugin's own line count) and cost the 64 MiB busbw that NCCL_PROTO=LL costs;
3. measures every candidate of tune.candidates("socket", {}) (each rank its own host, sockets on lo, as
   tune_candidates.py does), then the table size_table() builds from them through the plugin, then the default again
   (the noise), and says whether the choice per size beats the best single setting (tune.choose, as verify --tune).
Lines `TUNE_TRIAL {json}` keep each run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from sparkcluster.nccl.latency import size_words
from sparkcluster.nccl.tune import (
    DEFAULT,
    PER_SIZE_NAME,
    Candidate,
    candidates,
    choose,
    size_table,
    trial_of,
)
from tests.device.tune_candidates import arguments, run_probe

SOURCE = Path("sparkcluster/nccl/tuner/sizes_tuner.c")


def build(folder: Path) -> Path:
    plugin = folder / "libnccl-tuner-sparkcluster.so"
    subprocess.run(["cc", "-O2", "-Wall", "-shared", "-fPIC", str(SOURCE), "-o", str(plugin)], check=True)
    return plugin


def trial_line(name: str, env: dict[str, str], output: str):
    found = trial_of(Candidate(name, tuple(sorted(env.items()))), output)
    if found is None:
        print(f"# {name}: no result\n" + "\n".join(output.splitlines()[-8:]), flush=True)
        return None
    print("TUNE_TRIAL " + json.dumps({"name": name, "env": env, "latency_us": found.latency_us,
                                      "busbw_gbps": found.busbw_gbps, "sum_ok": found.sum_ok}), flush=True)
    return found


def main() -> int:
    args, decode, sizes = arguments(__doc__)
    folder = Path(tempfile.mkdtemp(prefix="sc-tuner-"))
    plugin = build(folder)
    cc = subprocess.run(["cc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"# built {plugin.name} with {cc}")

    # 2. the plugin steers NCCL: Ring + LL forced at every size through it
    forced = folder / "forced.csv"
    forced.write_text("allreduce,0,18446744073709551615,ring,ll,-1,-1,-1\n")
    env = {"NCCL_TUNER_PLUGIN": str(plugin), "NCCL_TUNER_CONFIG_FILE": str(forced), "NCCL_DEBUG": "INFO",
           "NCCL_DEBUG_SUBSYS": "INIT,TUNING"}
    output = run_probe(env, sizes, args.same_gpu)
    for line in output.splitlines():
        if "tuner" in line.lower() and ("loaded" in line or "sparkcluster tuner" in line):
            print("# NCCL: " + line.strip())
    trial_line("forced Ring + LL through the plugin", {k: v for k, v in env.items() if k.startswith("NCCL_TUNER")},
               output)

    # 3. every candidate, the table through the plugin, the default again
    trials = [t for c in candidates("socket", {}) if (t := trial_line(c.name, c.settings,
                                                                       run_probe(c.settings, sizes, args.same_gpu)))]
    table = size_table(trials, decode)
    if table is None:
        print("# no table: no algorithm-and-protocol pair ran")
    else:
        path = folder / "sizes.csv"
        path.write_text(table.csv())
        print(f"# table: {table.describe()}\n" + "".join(f"#   {line}\n" for line in table.csv().splitlines()))
        candidate = table.candidate(str(plugin), str(path))
        found = trial_line(candidate.name, candidate.settings, run_probe(candidate.settings, sizes, args.same_gpu))
        if found is not None:
            trials.append(replace(found, candidate=candidate))
    again = trial_line("default (again, last)", {}, run_probe({}, sizes, args.same_gpu))
    noise = 0.05
    if again is not None and trials and trials[0].candidate == DEFAULT:
        a, b = trials[0].decode_us(decode), again.decode_us(decode)
        noise = max(noise, abs(b - a) / a) if a and b else noise
    choice = choose(trials, decode, noise=noise)
    print(f"# decode sizes {', '.join(f'{size_words(b)} (c{c})' for c, b in decode.items())}; noise {noise:.0%}")
    for line in choice.lines:
        decode_us = "-" if line.decode_us is None else f"{line.decode_us:.1f}"
        change = "-" if line.change is None else f"{line.change:+.0%}"
        lost = "-" if line.busbw_change is None else f"{line.busbw_change:.0%}"
        print(f"  {line.name:<28}{decode_us:>10}{change:>8}{lost:>8}  {line.verdict}")
    print(f"# chosen: {choice.chosen.name} ({choice.reason})")
    # the best single setting verify --tune could keep: measured, its sum right, within its busbw
    singles = [l for l in choice.lines if l.decode_us is not None and l.name not in (DEFAULT.name, PER_SIZE_NAME)
               and l.verdict in ("faster", "chosen", "no faster beyond noise", "slower")]
    per_size = next((l for l in choice.lines if l.name == PER_SIZE_NAME), None)
    if per_size is not None and per_size.decode_us is not None and singles:
        best = min(singles, key=lambda l: l.decode_us or 0.0)
        print(f"# per size {per_size.decode_us:.1f} us against the best single setting, {best.name}, "
              f"{best.decode_us:.1f} us: {(best.decode_us - per_size.decode_us) / best.decode_us:+.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
