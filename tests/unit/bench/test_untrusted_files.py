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
from tests.support.helpers import run_cli
from tests.support.bench import receipt, result

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


# ---- bench --layouts: its state and its results ------------------------------------------------------------------

def _state(tmp_path: Path) -> tuple[Path, dict]:
    from tests.support.bench_layouts import TP2, measured, row

    from sparkcluster.bench.layouts import state

    path = tmp_path / state.STATE_FILE
    state.load(path, {"model": "m"}).record(measured("tp", TP2, [row(1, 40.0, 0.05, 0.02)]))
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("where, value, said", [
    ("done.0.serve_s", float("inf"), "serve_s is inf, not a finite number"),
    ("done.0.rows.0.generation_tps", int(HUGE), "rows' generation_tps is a number of 400 digits"),
    ("done.0.rows.0.requests", 1.5, "rows' requests is 1.5, not a whole number"),
    ("done.0.phases.launch", "soon", "phases.launch is 'soon', not a number"),
    ("inputs", ["model"], "inputs is \"['model']\", not an object"),
])
def test_a_tampered_layouts_state_is_refused(tmp_path, where, value, said):
    """Failed before: `serve_s: 1e999` was taken as infinity, a 400-digit figure an OverflowError traceback."""
    from sparkcluster.bench.layouts import state

    path, doc = _state(tmp_path)
    text = json.dumps(_set(doc, where, value)).replace("Infinity", "1e999")  # as a hand would write it
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        state.load(path, {"model": "m"})
    assert said in e.value.message and "not a bench --layouts state file" in e.value.message


def test_a_deep_or_special_layouts_state_is_refused(tmp_path):
    """Failed before: RecursionError traceback; a FIFO would hang the run before it connected."""
    from sparkcluster.bench.layouts import state

    path = tmp_path / state.STATE_FILE
    path.write_text(DEEP)
    with pytest.raises(UsageError, match="nested deeper than"):
        state.load(path, {})
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(UsageError, match=r"not a regular file \(a FIFO\)"):
        state.load(path, {})


def test_a_state_names_the_cluster_beyond_its_inventory_path_and_node_names(tmp_path):
    """Failed before: another cluster behind the same ./inventory.yml and node names resumed the first's figures."""
    from sparkcluster.bench.layouts import state
    from sparkcluster.engine.inventory import load_inventory

    first = tmp_path / "inventory.yml"
    first.write_text("hosts:\n  spark-1: {address: 10.0.0.1, role: head}\n  spark-2: {address: 10.0.0.2}\n")
    one = state.cluster(load_inventory(first))
    assert one == state.cluster(load_inventory(first))  # stable: the same inventory, the same identity
    first.write_text("hosts:\n  spark-1: {address: 10.9.0.1, role: head}\n  spark-2: {address: 10.9.0.2}\n")
    assert state.cluster(load_inventory(first)) != one


def test_layouts_results_and_state_never_follow_a_planted_link(tmp_path, monkeypatch, capsys):
    """Failed before: `--out DIR` with DIR/layouts.json -> victim.txt wrote the results into victim.txt, and a link
    at DIR/layouts-state.json.partial was written through the same way."""
    from tests.support.bench_layouts import Cluster, inventory_file, on_cluster

    from sparkcluster import cli
    from sparkcluster.bench.cli import cmd_bench

    out = tmp_path / "out"
    out.mkdir()
    victims = [tmp_path / "victim.txt", tmp_path / "victim2.txt"]
    for victim, name in zip(victims, ("layouts.json", "layouts-state.json.partial"), strict=True):
        victim.write_text("mine")
        (out / name).symlink_to(victim)
    args = cli.build_parser(["bench"]).parse_args(["bench", "-i", str(inventory_file(tmp_path, 2)), "--layouts", "tp",
                                                   "--model", "org/m", "--concurrency", "1", "--out", str(out), "--json"])
    args.remote = []
    assert cmd_bench(args, on_cluster(monkeypatch, Cluster(), staged_s=1.0)) == 0
    assert [v.read_text() for v in victims] == ["mine", "mine"]
    assert json.loads((out / "layouts.json").read_text())["layouts"][0]["layout"] == "tp"
    assert json.loads((out / "layouts-state.json").read_text())["inputs"]["cluster"].startswith("sha256:")


def test_a_csv_its_receipt_and_the_arena_files_never_follow_a_planted_link(tmp_path):
    """Failed before (by code, as the report says): write_text through whatever lay at FILE.csv.receipt.json."""
    from sparkcluster.bench import receipts
    from sparkcluster.bench.methods.llama_benchy import arena
    from sparkcluster.bench.methods.llama_benchy.schedule import Cell

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    beside = tmp_path / "bench.csv.receipt.json"
    beside.symlink_to(victim)
    receipts.write_beside(tmp_path / "bench.csv", receipt())
    cell = Cell(depth=0, pp=8, tg=4, concurrency=1)
    cell_link = arena.cell_file(tmp_path / "arena", cell)
    cell_link.parent.mkdir(parents=True)
    cell_link.symlink_to(victim)
    arena.save_cell(tmp_path / "arena", cell, {"benchmarks": []})
    assert victim.read_text() == "mine" and not beside.is_symlink() and "engine" in beside.read_text()
    assert not cell_link.is_symlink() and json.loads(cell_link.read_text()) == {"benchmarks": []}
    from tests.support.bench_layouts import row

    from sparkcluster.bench.methods.closed_loop import table
    from sparkcluster.bench.methods.closed_loop.sweep import Level

    csv = tmp_path / "bench.csv"
    csv.symlink_to(victim)
    table.save_csv([Level(row(1, 40.0, 0.05, 0.02), None)], csv)
    assert victim.read_text() == "mine" and csv.read_text().startswith("concurrency,")


def test_a_published_file_to_compare_with_is_read_as_a_result_is(tmp_path):
    """`bench --compare FILE`: a FIFO hung and a link to /dev/zero ran out of memory, as --explain's did."""
    from sparkcluster.bench.methods.llama_benchy import published

    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO"), (zero, "a character device")):
        with pytest.raises(UsageError, match=rf"not a regular file \({kind}\)"):
            published.load(path)


def test_a_bundle_is_never_written_over_a_device(tmp_path):
    """The bundle's writer (now engine/localfiles.py) replaced whatever lay at its path once whole: a FIFO (as root,
    /dev/null) is refused before anything connects."""
    from sparkcluster.doctor.cli import bundle_path

    fifo = tmp_path / "b.tar.gz"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match=r"--bundle .*b.tar.gz: .* is a FIFO, not a regular file"):
        bundle_path(str(fifo))

