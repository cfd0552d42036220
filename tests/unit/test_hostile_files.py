"""Files someone else made, read and written (round 6's F8, F11, F12, F13): a result `bench --explain` reads, a
`bench --layouts` state, a doctor baseline. Each hostile shape the adversarial report found is refused with exit 2
naming the file (never a traceback, a hang or all the memory), and nothing sparkcluster writes follows a link or
replaces a device planted where it writes."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from sparkcluster.bench.explain import facts as explain_facts
from sparkcluster.bench.explain.lineup import explain, render
from sparkcluster.bench.explain.sides import load_result, sides
from sparkcluster.bench.receipt import Receipt
from sparkcluster.doctor import baseline
from sparkcluster.engine.errors import EXIT_USAGE, UsageError
from sparkcluster.engine.localfiles import read_json, replacing, write_text
from tests.helpers import run_cli
from tests.unit.test_bench_explain import receipt, result

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 400  # an integer no float holds


def good(tmp_path: Path) -> dict:
    return json.loads(Path(result(tmp_path, "good.json", receipt())).read_text())


def written(tmp_path: Path, doc: dict | str, name: str = "hostile.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


# ---- bench --explain: each shape the report gave a traceback for ---------------------------------------------------

def _set(doc: dict, where: str, value: object) -> dict:
    doc = copy.deepcopy(doc)
    *path, last = where.split(".")
    node = doc
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


HOSTILE_RESULTS = {  # where in a good result -> the value planted there -> what the refusal names
    "rows of strings": ("rows", ["x", 1], "its `rows` hold something other than objects"),
    "benchmarks of strings": (None, {"benchmarks": ["x"], "receipt": "RECEIPT"},
                              "its `benchmarks` hold something other than objects"),
    "sparkcluster a string": (None, {"benchmarks": [], "sparkcluster": "x"}, "holds no receipt"),
    "ints in command": ("receipt.engine.command", ["vllm", "serve", 5], "engine.command is ['vllm', 'serve', 5]"),
    "comm_env a list": ("receipt.comm_env", ["a"], "comm_env is ['a'], not an object"),
    "connectx_firmware a list": ("receipt.nodes.0.connectx_firmware", ["a"], "nodes[0].connectx_firmware is ['a']"),
    "metrics a list": ("receipt.metrics", [1], "metrics is [1], not an object"),
    "parameters a list": ("receipt.bench.parameters", [1, 2], "bench.parameters is [1, 2], not an object"),
    "a 400-digit figure": ("rows.0.generation_tps", int(HUGE), "a number no float holds"),
    "400-digit drafts": ("receipt.metrics", {"speculative": True, "spec_decode": {
        "drafts": int(HUGE), "draft_tokens": 1, "accepted_tokens": 1}}, "metrics.spec_decode.drafts is 999"),
    "an endpoint of a list": ("receipt.endpoint", ["x"], "endpoint is ['x'], not text"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RESULTS))
def test_a_result_of_the_wrong_shape_is_refused_naming_the_field(tmp_path, case):
    """Failed before: AttributeError, TypeError or OverflowError tracebacks (exit 1)."""
    where, value, said = HOSTILE_RESULTS[case]
    doc = good(tmp_path)
    hostile = _set(doc, where, value) if where else {k: doc["receipt"] if v == "RECEIPT" else v
                                                     for k, v in value.items()}
    with pytest.raises(UsageError) as e:
        sides([written(tmp_path, hostile), result(tmp_path, "b.json", receipt())], None)
    assert said in e.value.message and e.value.exit_code == EXIT_USAGE and "bench --json" in e.value.fix


def test_a_deeply_nested_result_is_refused(tmp_path):
    """Failed before: RecursionError traceback."""
    with pytest.raises(UsageError, match="nested deeper than"):
        load_result(written(tmp_path, DEEP))
    nested = "[" * 150 + "]" * 150  # parses, but deeper than any file sparkcluster writes
    with pytest.raises(UsageError, match="nested deeper than 100 levels"):
        load_result(written(tmp_path, nested, "nested.json"))


def test_a_device_or_a_fifo_is_refused_before_reading(tmp_path):
    """Failed before: MemoryError (the size check read st_size 0 of /dev/zero), and a FIFO hung forever."""
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, kind in ((zero, "a character device"), (fifo, "a FIFO")):
        with pytest.raises(UsageError) as e:
            load_result(str(path))
        assert f"not a regular file ({kind})" in e.value.message


def test_the_cli_refuses_hostile_results_with_exit_2_and_no_traceback(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for hostile in (written(tmp_path, DEEP), written(tmp_path, _set(good(tmp_path), "rows", ["x"]), "rows.json"),
                    str(fifo)):
        refused = run_cli("bench", "--explain", hostile, result(tmp_path, "b.json", receipt()), timeout=60)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert "fix:" in refused.stderr


def test_a_result_file_is_read_at_most_to_its_bound(tmp_path):
    path = tmp_path / "big.json"
    path.write_text("[" + "1," * 600 + "1]")
    with pytest.raises(UsageError, match="larger than 0 MiB"):
        read_json(path, "big.json", "a test", "fix", limit=1000)


# ---- F8: the receipt's unknown fields are computed once, not per fact --------------------------------------------

def test_explain_computes_a_receipts_unknown_fields_once(tmp_path, monkeypatch):
    """Failed before: receipt.unknown() (which serialises the whole receipt) was called per fact: a 500-node
    receipt took 148 s (benchmarks/explain_scaling.py measures it)."""
    calls = []
    real = Receipt.unknown
    monkeypatch.setattr(Receipt, "unknown", lambda self: calls.append(1) or real(self))
    doc = good(tmp_path)
    doc["receipt"]["nodes"] = [{"name": f"spark-{i}", "kernel": "6.11"} for i in range(500)]
    made = Receipt.from_json(doc["receipt"])
    found, _ = explain_facts.receipt_facts(made)
    assert len(found) > 1000 and len(calls) == 1


# ---- F11: a value of the file is printed without its escapes -----------------------------------------------------

def test_escapes_in_a_result_are_not_printed(tmp_path):
    """Failed before: the title, clear-screen and OSC 8 sequences reached the terminal as written."""
    doc = good(tmp_path)
    title, clear, link = "\x1b]0;PWNED-TITLE\x07", "\x1b[2J\x1b[31mRED", "\x1b]8;;http://evil/\x1b\\click\x1b]8;;\x1b\\"
    doc = _set(doc, "receipt.comm_env.spark-2.NCCL_IB_HCA", title + clear)
    doc = _set(doc, "receipt.endpoint", "http://x/v1" + link)
    doc = _set(doc, "receipt.bench.parameters.output_tokens", "\x1b[2J")
    doc = _set(doc, "rows.0.concurrency", "1\x1b[2J")
    text = render(explain(*sides([written(tmp_path, doc), result(tmp_path, "b.json", receipt())], None)))
    assert "\x1b" not in text and "\x07" not in text
    assert "PWNED-TITLE" not in text and "NCCL_IB_HCA: A RED, B not set" in text and "clickhttp" not in text


# ---- F13: doctor --baseline and --save-baseline ------------------------------------------------------------------

@pytest.mark.parametrize("content, said", [
    (DEEP, "nested deeper than"),
    ('{"version": 1, "nodes": {"spark-1": {"cma_total_kb": ' + "9" * 5000 + "}}}", "a number too long to read"),
    ('{"version": 1, "nodes": {"spark-1": {"busbw_gbps": {"all": ' + HUGE + "}}}}", "node 'spark-1' has busbw_gbps"),
])
def test_a_hostile_baseline_is_refused(tmp_path, content, said):
    """Failed before: RecursionError and ValueError tracebacks (json.loads raises a plain ValueError for 5000
    digits); a 400-digit busbw overflowed when compared."""
    with pytest.raises(UsageError) as e:
        baseline.read(written(tmp_path, content))
    assert said in e.value.message and "--save-baseline" in e.value.fix


def test_a_baseline_that_is_a_fifo_or_a_device_is_refused(tmp_path):
    """Failed before: a FIFO hung, a link to /dev/zero ran out of memory."""
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (zero, fifo):
        with pytest.raises(UsageError, match="not a regular file"):
            baseline.read(str(path))


def test_save_baseline_never_replaces_a_device(tmp_path):
    """Failed before: `--save-baseline` at a character device replaced it with a regular file (as root:
    /dev/null). A FIFO stands in for the device here (mknod needs root); /dev/null itself is checked, not written."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/null")):
        with pytest.raises(UsageError, match="not a regular file") as e:
            baseline.writable(str(target))
        assert e.value.exit_code == EXIT_USAGE
    with pytest.raises(UsageError, match="a FIFO, not a regular file"):
        baseline.write(baseline.Baseline("now", {}), fifo)
    assert fifo.is_fifo() and [p.name for p in tmp_path.iterdir()] == ["fifo"]


# ---- the writer every result goes through ------------------------------------------------------------------------

def test_a_planted_link_is_replaced_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    os.chmod(victim, 0o600)
    planted = tmp_path / "out" / "layouts.json"
    planted.parent.mkdir()
    planted.symlink_to(victim)
    write_text(planted, "results")
    assert victim.read_text() == "mine" and not planted.is_symlink() and planted.read_text() == "results"
    assert oct(planted.stat().st_mode & 0o777) == "0o644"


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), replacing(path) as f:
        f.write(b"half")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]
