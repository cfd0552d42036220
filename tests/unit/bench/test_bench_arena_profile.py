"""`bench --profile arena-v2 --out DIR` against tests/support/openai_stub.py (fast: 10 ms to the first token even at
100k tokens, 0.5 ms a token): all 28 cells in the Arena's order, the files sparkrun's uploader sends, in their
shapes; an interrupted run resumes, measuring only the cells that are missing. --runs 1 keeps it to ~20 s."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from sparkcluster.bench.methods.llama_benchy.formats import CSV_COLUMNS
from sparkcluster.bench.methods.llama_benchy.profile import ARENA_V2
from tests.support.helpers import run_cli
from tests.support.openai_stub import running_stub

FAST = {"ttft": 0.01, "itl": 0.0005, "prefill_tps": 10_000_000}
METADATA_KEYS = {"recipe", "timing", "cluster", "benchmark", "model", "runtime_info", "sparkrun", "sparkcluster"}


def arena(tmp_path: Path, url: str, out: Path, *flags: str):
    book = tmp_path / "book.txt"
    book.write_text(" ".join(f"word{(i * 7919) % 500}" for i in range(20000)))
    return run_cli("bench", "--url", url, "--profile", "arena-v2", "--out", str(out), "--runs", "1",
                   "--corpus", str(book), *flags, env={"HF_HUB_CACHE": str(tmp_path / "hub")}, timeout=300)


def expected_names() -> list[str]:
    names = []
    for depth, c in ARENA_V2.order():
        if depth == 0:
            names += [f"pp2048 (c{c})", f"tg128 (c{c})"]
        else:
            names += [f"ctx_pp @ d{depth} (c{c})", f"ctx_tg @ d{depth} (c{c})", f"pp2048 @ d{depth} (c{c})",
                      f"tg128 @ d{depth} (c{c})"]
    return names


def test_an_interrupted_arena_run_resumes_and_writes_the_arenas_files(tmp_path):
    out = tmp_path / "arena"
    # Session start: 3 prompt probes + the coherence question = 4 requests; the first cell (8192, c5) warms up
    # and runs (context load and inference: 20), the second (4096, c5) runs once (10); the third fails.
    with running_stub(**FAST, fail_after=34) as url:
        first = arena(tmp_path, url, out)
    assert first.returncode == 1, first.stderr
    assert "HTTP 500" in first.stderr
    kept = sorted(p.name for p in (out / "cells").iterdir())
    assert kept == ["benchmark_d4096_c5_pp2048_tg128.json", "benchmark_d8192_c5_pp2048_tg128.json"]
    before = {name: (out / "cells" / name).read_text() for name in kept}
    with running_stub(**FAST) as url:
        second = arena(tmp_path, url, out, "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["sparkcluster"]["cells_measured"] == 26  # the 2 finished were not re-run
    assert {name: (out / "cells" / name).read_text() for name in kept} == before

    merged = json.loads((out / "benchmark.json").read_text())
    assert set(merged) == {"model", "max_concurrency", "benchmarks"} and merged["max_concurrency"] == 10
    cells = [(b["context_size"], b["concurrency"]) for b in merged["benchmarks"] if not b["is_context_prefill_phase"]]
    assert cells == ARENA_V2.order()  # the profile's own order, resumed cells included
    rows = list(csv.reader((out / "benchmark.csv").open()))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 1 + 104
    assert [r[1] for r in rows[1:]] == expected_names()
    assert all(float(r[2]) > 0 for r in rows[1:])  # t_s_mean of every row measured
    metadata = json.loads((out / "metadata.json").read_text())
    assert set(metadata) == METADATA_KEYS
    assert metadata["benchmark"]["framework"] == "llama-benchy"
    assert metadata["benchmark"]["profile"] == "@official/spark-arena-v2" and metadata["benchmark"]["resumed"]
    assert metadata["benchmark"]["completed_at"] is not None
    assert metadata["recipe"]["text"] == (out / "recipe.yaml").read_text()
    assert yaml.safe_load(metadata["recipe"]["text"])["model"] == "stub-model"


def test_a_re_run_of_a_finished_profile_measures_nothing(tmp_path):
    profile = tmp_path / "small.yaml"
    profile.write_text("framework: llama-benchy\nargs: {pp: [64], tg: [8], depth: [0, 256], concurrency: [1, 2],"
                       " prefix_caching: true, runs: 1}\nschedule:\n  - {depth: 256, concurrency: 2}\n"
                       "  - {depth: 0, concurrency: 1}\n")
    out = tmp_path / "small"
    with running_stub(**FAST) as url:
        base = ["bench", "--url", url, "--profile", str(profile), "--out", str(out), "--corpus"]
        book = tmp_path / "book.txt"
        book.write_text(" ".join(f"w{i % 300}" for i in range(5000)))
        first = run_cli(*base, str(book), "--json", timeout=120)
        again = run_cli(*base, str(book), "--json", timeout=120)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert json.loads(first.stdout)["sparkcluster"]["cells_measured"] == 2
    assert json.loads(again.stdout)["sparkcluster"]["cells_measured"] == 0
    assert [b["context_size"] for b in json.loads(again.stdout)["benchmarks"]] == [256, 256, 0]


@pytest.mark.serial  # Ctrl-C lands while a stub's answer is held: failed once beside another test
def test_ctrl_c_keeps_every_finished_cell(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.support.bench import _sigint_as_a_terminal_sends_it, _stub_requests

    profile = tmp_path / "small.yaml"
    profile.write_text("args: {pp: [64], tg: [8], depth: [0, 256], concurrency: [1, 2], prefix_caching: true, runs: 1}"
                       "\nschedule:\n  - {depth: 256, concurrency: 2}\n  - {depth: 0, concurrency: 1}\n")
    book = tmp_path / "book.txt"
    book.write_text(" ".join(f"w{i % 300}" for i in range(5000)))
    out = tmp_path / "small"
    # Session start (4 requests) and the first cell (a warm-up and a run, each a context load and an inference
    # burst of 2: 8); the second cell's request is accepted and never answered, until Ctrl-C.
    with running_stub(**FAST, stall_after=12) as url:
        process = subprocess.Popen([sys.executable, "-m", "sparkcluster", "bench", "--url", url, "--profile",
                                    str(profile), "--out", str(out), "--corpus", str(book)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_a_terminal_sends_it)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None and _stub_requests(url) < 13:
            time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert "interrupted: 1 of 2 cells measured" in stderr
    assert "pp64 @ d256 (c2)" in stdout  # the finished cell's rows, as llama-benchy's table
    assert [p.name for p in (out / "cells").iterdir()] == ["benchmark_d256_c2_pp64_tg8.json"]
    rows = list(csv.reader((out / "benchmark.csv").open()))
    assert [r[1] for r in rows[1:]] == ["ctx_pp @ d256 (c2)", "ctx_tg @ d256 (c2)", "pp64 @ d256 (c2)",
                                        "tg8 @ d256 (c2)"]
    assert json.loads((out / "metadata.json").read_text())["benchmark"]["completed_at"] is None
