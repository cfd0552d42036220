"""Which flags each mode of bench reads, with their defaults read off bench's own declarations (flagset.py): one
source of them, where four hand-kept tables once repeated the parser's defaults; a flag of another mode is refused
naming it, before anything connects."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sparkcluster.bench
from sparkcluster import cli
from sparkcluster.bench.cli import cmd_bench, modes
from sparkcluster.engine.errors import UsageError

BENCH = Path(sparkcluster.bench.__file__).parent


def test_each_modes_flags_have_the_defaults_bench_parses_and_no_flag_is_in_two_methods():
    found = modes()
    parsed = cli.build_parser(["bench"]).parse_args(["bench"])  # every flag at its default
    for flag_set in (found.sustained, found.benchy, found.one_endpoint):
        assert flag_set.defaults == {dest: getattr(parsed, dest) for dest in flag_set.defaults}
    assert set(found.sustained.defaults) & set(found.benchy.defaults) == set()
    assert list(found.one_endpoint.defaults) == ["url", "compare", "csv", "plot", "profile"]
    assert {"prompt_tokens", "warmup", "requests_per_stream", "prefix_cache"} <= set(found.sustained.defaults)
    assert {"pp", "latency_mode", "no_warmup", "out"} <= set(found.benchy.defaults)


def test_no_module_of_bench_keeps_a_table_of_flag_defaults():
    tables = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if any("DEFAULTS" in n or n == "ONE_SERVE_ONLY" for n in names):
                tables.append(f"{path.relative_to(BENCH)}: {names}")
    assert tables == []


@pytest.mark.parametrize("flags, named", [
    (["--method", "llama-benchy", "--warmup", "2"], "--warmup: not a flag of --method llama-benchy"),
    (["--latency-mode", "none"], "--latency-mode: not a flag of --method sustained"),
    (["--layouts", "tp", "--csv", "x.csv"], "--csv with --layouts"),
])
def test_a_flag_of_another_mode_is_refused_naming_it(flags, named):
    args = cli.build_parser(["bench"]).parse_args(["bench", "--url", "http://127.0.0.1:9/v1", *flags])
    args.remote = []
    if "--layouts" in flags:
        args.url = None
    with pytest.raises(UsageError) as refused:
        cmd_bench(args, None)  # type: ignore[arg-type]
    assert named in refused.value.message
