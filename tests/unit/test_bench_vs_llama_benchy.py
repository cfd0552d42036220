"""llama-benchy 0.4.0 itself (scripts/setup.sh installs it in .venv-benchy) and `bench --method llama-benchy`
measure the same stub with the same grid, book and tokenizer: every metric of every cell agrees within 5%, and
the two JSON documents have the same keys (ours adds one, `sparkcluster`). Offline: llama-benchy reads the
book from its cache under $HOME and a word-level tokenizer.json made here."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from sparkcluster.bench.benchy_stats import METRICS
from sparkcluster.bench.corpus import BOOK_URL
from tests.helpers import run_cli
from tests.openai_stub import running_stub

ROOT = Path(__file__).resolve().parents[2]
LLAMA_BENCHY = ROOT / ".venv-benchy" / "bin" / "llama-benchy"
GRID = ["--pp", "256", "--tg", "32", "--depth", "0", "1024", "--concurrency", "1", "2", "--runs", "2",
        "--enable-prefix-caching"]
VOCABULARY = [f"word{i}" for i in range(500)]


def book_and_tokenizer(home: Path) -> tuple[Path, Path]:
    """The book where llama-benchy caches its download, and a tokenizer.json with one token per word."""
    tokenizers = pytest.importorskip("tokenizers")
    book = home / ".cache" / "llama-benchy" / f"{hashlib.md5(BOOK_URL.encode()).hexdigest()}.txt"
    book.parent.mkdir(parents=True)
    book.write_text(" ".join(VOCABULARY[(i * 7919) % 500] for i in range(20000)))
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate([*VOCABULARY, "[UNK]"])}, unk_token="[UNK]"))
    inner.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = home / "tokenizer.json"
    inner.save(str(tokenizer))
    return book, tokenizer


def test_bench_agrees_with_llama_benchy_on_every_metric_of_every_cell(tmp_path):
    if not LLAMA_BENCHY.exists():
        pytest.skip("llama-benchy is not installed in .venv-benchy (scripts/setup.sh installs it)")
    book, tokenizer = book_and_tokenizer(tmp_path)
    theirs_path = tmp_path / "theirs.json"
    with running_stub(ttft=0.1, itl=0.01, prefill_tps=20000) as url:
        theirs_run = subprocess.run(
            [str(LLAMA_BENCHY), "--base-url", url, "--model", "stub-model", "--tokenizer", str(tokenizer), *GRID,
             "--format", "json", "--save-result", str(theirs_path)],
            capture_output=True, text=True, timeout=300, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert theirs_run.returncode == 0, theirs_run.stdout[-2000:] + theirs_run.stderr[-2000:]
        ours_run = run_cli("bench", "--url", url, "--method", "llama-benchy", "--tokenizer", str(tokenizer),
                           "--corpus", str(book), *GRID, "--json", timeout=300)
        assert ours_run.returncode == 0, ours_run.stderr
    theirs, ours = json.loads(theirs_path.read_text()), json.loads(ours_run.stdout)
    assert set(ours) == set(theirs) | {"sparkcluster"}
    assert {k: ours[k] for k in ("version", "latency_mode", "model", "prefix_caching_enabled", "max_concurrency")} \
        == {k: theirs[k] for k in ("version", "latency_mode", "model", "prefix_caching_enabled", "max_concurrency")}
    assert len(ours["benchmarks"]) == len(theirs["benchmarks"]) == 6
    for mine, reference in zip(ours["benchmarks"], theirs["benchmarks"]):
        assert set(mine) == set(reference)
        shape = ("concurrency", "context_size", "prompt_size", "response_size", "is_context_prefill_phase")
        assert [mine[k] for k in shape] == [reference[k] for k in shape]
        for name in METRICS:
            assert (mine[name] is None) == (reference[name] is None), name
            if reference[name] is None:
                continue
            assert set(mine[name]) == set(reference[name]) == {"mean", "std", "values"}
            assert len(mine[name]["values"]) == len(reference[name]["values"]), name
            cell = f"{name} of d{mine['context_size']} c{mine['concurrency']} ctx={mine['is_context_prefill_phase']}"
            assert abs(mine[name]["mean"] - reference[name]["mean"]) <= 0.05 * reference[name]["mean"], \
                f"{cell}: ours {mine[name]['mean']:.2f}, llama-benchy's {reference[name]['mean']:.2f}"
