"""verify --tune's candidates measured on a GPU host, each rank its own host (NCCL_HOSTID), with the probe itself
(issue 50). GPU-only and opt-in, run by hand from the repository root (sparkcluster importable: PYTHONPATH=.):

    python3 tests/device/tune_candidates.py [--same-gpu] [--hidden-size 4096] [--concurrency 1,8]

Each candidate of sparkcluster.nccl.tune.candidates("socket", {}) runs the probe under torchrun with two ranks
(`--same-gpu`: both on GPU 0, for a one-GPU machine under CUDA MPS), NCCL over sockets on lo; the default runs first
and again last (their spread is the noise). Then tune.choose() picks, as verify --tune does, and a table says each
candidate's decode all-reduce time and busbw against the default's. Lines `TUNE_TRIAL {json}` keep each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace

from sparkcluster.nccl.latency import size_words
from sparkcluster.nccl.tune import BANDWIDTH_SIZES, DEFAULT, candidates, choose, decode_sizes, trial_of

EXTRA_SIZES = (32 << 10, 512 << 10, 2 << 20)  # beside the decode sizes: the 8K-2M, per size


def run_probe(env: dict[str, str], latency_sizes: str, same_gpu: bool) -> str:
    probe = ["python3", "sparkcluster/nccl/probe.py", "--ops", "all_reduce", "--sizes", BANDWIDTH_SIZES,
             "--latency-sizes", latency_sizes] + (["--local-rank", "0"] if same_gpu else [])
    # each rank its own host: NCCL_HOSTID from torchrun's RANK, set before the probe starts
    line = 'NCCL_HOSTID=tune-host-$RANK exec "$@"'
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--no-python",
            "sh", "-c", line, "sh", *probe]
    full = {**os.environ, "NCCL_NVLS_ENABLE": "0", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo", **env}
    done = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=240)
    return done.stdout + done.stderr


def arguments(doc: str) -> tuple[argparse.Namespace, dict[int, int], str]:
    """The flags this check and tuner_plugin.py share; the decode sizes; every size the probe times."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--same-gpu", action="store_true")
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    decode = decode_sizes(args.hidden_size, [int(c) for c in args.concurrency.split(",")])
    return args, decode, ",".join(str(s) for s in sorted({*decode.values(), *EXTRA_SIZES}))


def main() -> int:
    args, decode, sizes = arguments(__doc__)
    tried = candidates("socket", {})
    trials = []
    for candidate in [*tried, DEFAULT]:
        output = run_probe(candidate.settings, sizes, args.same_gpu)
        found = trial_of(candidate, output)
        if found is None:
            print(f"# {candidate.name}: no result\n" + "\n".join(output.splitlines()[-5:]), flush=True)
            continue
        print("TUNE_TRIAL " + json.dumps({"name": candidate.name, "env": candidate.settings,
                                          "latency_us": found.latency_us, "busbw_gbps": found.busbw_gbps,
                                          "sum_ok": found.sum_ok}), flush=True)
        trials.append(found)
    defaults = [t for t in trials if t.candidate == DEFAULT]
    if len(defaults) == 2:  # the default twice: its spread is the run's noise
        first, last = defaults
        spread = {s: f"{abs(last.latency_us[s] - first.latency_us[s]) / first.latency_us[s]:.0%}"
                  for s in first.latency_us if s in last.latency_us}
        print(f"# the default, first and last: spread per size {spread}")
        trials = [t for t in trials if t is not last]
        trials.append(replace(last, candidate=replace(DEFAULT, name="default (again, last)")))
    choice = choose(trials, decode)
    print(f"# decode sizes {', '.join(f'{size_words(b)} (c{c})' for c, b in decode.items())}")
    print(f"# {'candidate':<28}{'decode us':>10}{'vs default':>11}{'busbw lost':>11}  verdict  | per size us")
    by_name = {t.candidate.name: t for t in trials}
    for line in choice.lines:
        per = by_name[line.name].latency_us
        sizes_us = " ".join(f"{size_words(s)}={us:.1f}" for s, us in sorted(per.items()))
        change = "-" if line.change is None else f"{line.change:+.0%}"
        lost = "-" if line.busbw_change is None else f"{line.busbw_change:.0%}"
        decode_us = "-" if line.decode_us is None else f"{line.decode_us:.1f}"
        print(f"  {line.name:<28}{decode_us:>10}{change:>11}{lost:>11}  {line.verdict}  | {sizes_us}")
    print(f"# chosen: {choice.chosen.name} ({choice.reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
