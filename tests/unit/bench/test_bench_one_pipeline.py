"""Bench as one pipeline (issue 41): both methods are a schedule and an arithmetic over one client, one timeline of
request events and one renderer. The direction (issue 47): nothing in bench's root imports a method, and a method
imports only its own modules and the shared ones, so no twin of a shared module can hide under another name."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import sparkcluster.bench
from sparkcluster.bench import render
from sparkcluster.bench.methods.closed_loop.schedule import request_timeline
from sparkcluster.bench.methods.llama_benchy import formats
from sparkcluster.bench.methods.llama_benchy.chat import Client
from sparkcluster.bench.sse import BadResponse, Usage
from sparkcluster.bench.timeline import Chunk, Exchange
from tests.support.bench import benchy
from tests.support.helpers import run_cli
from tests.support.openai_stub import running_stub

BENCH = Path(sparkcluster.bench.__file__).parent
PACKAGE = BENCH.parent
URL = "http://127.0.0.1:1/v1"


def imported(path: Path) -> set[str]:
    """The sparkcluster modules a file imports, relative imports resolved, those inside functions included."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if path.name == "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("sparkcluster.bench")}


def bench_modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


# What chooses a method and hands it its flags: the command's wiring, and --layouts' driver, which measures each
# layout with the method the flags pick (layouts/methods.py).
CALLERS = {BENCH / "cli.py", *bench_modules(BENCH / "layouts")}
METHODS = BENCH / "methods"
SHARED = [p for p in bench_modules(BENCH) if METHODS not in p.parents and p not in CALLERS]


def test_bench_has_two_methods_beside_the_shared_modules():
    methods = {p.name for p in METHODS.iterdir() if (p / "__init__.py").exists()}
    assert methods == {"closed_loop", "llama_benchy"}
    assert not list(BENCH.glob("benchy_*")), "llama-benchy's modules belong in bench/methods/llama_benchy/"


def test_nothing_in_benchs_root_imports_a_method():
    """The shared modules (client, stream reader, timeline, statistics, renderer, receipt, endpoint...) know no method:
    a module only one method reads lives in that method's folder."""
    wrong = {str(p.relative_to(BENCH)): sorted(n for n in imported(p) if n.startswith("sparkcluster.bench.methods"))
             for p in SHARED}
    assert {k: v for k, v in wrong.items() if v} == {}


def test_a_method_imports_only_its_own_modules_and_the_shared_ones():
    shared = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in SHARED}
    shared |= {name.removesuffix(".__init__") for name in shared}
    for method in ("closed_loop", "llama_benchy"):
        own = f"sparkcluster.bench.methods.{method}"
        for path in bench_modules(METHODS / method):
            names = imported(path)
            # `from ... import receipts`: the package named, with its module
            wrong = sorted(n for n in names if n not in shared and not n.startswith(own) and n != "sparkcluster.bench"
                           and n.rsplit(".", 1)[0] not in (shared | {"sparkcluster.bench"}))
            assert wrong == [], f"{path.relative_to(BENCH)} imports {wrong}"


def streamed() -> Exchange:
    """Two tokens with text, then an empty chunk that closes the stream and carries the third token usage counts."""
    return Exchange(0.5, 3.5, [Chunk("a", 1.0), Chunk("b", 2.0), Chunk("", 3.0, None, "length")],
                    [Usage(prompt_tokens=5, completion_tokens=3)], status=200)


def test_one_exchange_is_read_by_both_methods_each_by_its_own_rule():
    seen = streamed()
    ours = request_timeline(seen, f"{URL}/completions", key_sent=False)
    assert (ours.start, ours.end, ours.token_times) == (0.5, 3.5, (1.0, 2.0, 3.0))  # the closing chunk is the 3rd
    assert (ours.prompt_tokens, ours.completion_tokens, ours.error) == (5, 3, None)
    client = Client(URL, "m", 30)
    theirs = client.result(seen)
    # llama-benchy spreads the server's 3 tokens over the chunks that carried text, as 0.4.0 does
    assert (theirs.start_ts, theirs.end_ts, theirs.first_response_ts, theirs.first_token_ts) == (0.5, 3.5, 1.0, 1.0)
    assert (theirs.token_timestamps, theirs.total_tokens, theirs.prompt_tokens) == ([1.0, 1.5, 2.0], 3, 5)
    assert client.tally.to_json() == {"requests": 1, "prompt_tokens": 5, "completion_tokens": 3, "counted_tokens": 3}


@pytest.mark.parametrize(("seen", "ours", "theirs"), [
    (Exchange(0.0, 1.0, status=503, refusal="busy"), "HTTP 503: busy", "HTTP 503: busy"),
    (Exchange(0.0, 1.0, [Chunk("a", 0.5)], status=200, server_error="out of memory"),
     "server error: out of memory", "the server reported: out of memory"),
    (Exchange(0.0, 1.0, status=200, failure=BadResponse("an event is not JSON")),
     f"{URL}/completions: an event is not JSON", f"{URL}/chat/completions: an event is not JSON"),
    (Exchange(0.0, 1.0, status=200), "the stream ended without output",
     f"{URL}/chat/completions: the stream ended without output (not one choice: no token, no finish_reason)"),
])
def test_a_failed_exchange_is_an_error_in_each_methods_words(seen: Exchange, ours: str, theirs: str):
    assert request_timeline(seen, f"{URL}/completions", key_sent=False).error == ours
    assert Client(URL, "m", 30).result(seen).error == theirs


def test_both_methods_write_csv_through_the_one_renderer():
    assert formats.csv_text("m", [], 1) == render.csv_text(formats.CSV_COLUMNS, []) == ",".join(
        formats.CSV_COLUMNS) + "\r\n"


def test_one_reader_asks_the_endpoint_its_version():
    """Issue 47: /version was read two ways (the sweep's own GET beside the receipt's bounded one); receipts.py's
    is the one left, and the closed loop's config and its receipt say what it read."""
    readers = sorted(str(p.relative_to(PACKAGE)) for folder in (BENCH, PACKAGE / "observe")
                     for p in bench_modules(folder) if '/version"' in p.read_text(encoding="utf-8"))
    assert readers == ["bench/receipts.py"]
    with running_stub() as endpoint:  # its /version says "stub"
        result = run_cli("bench", "--url", endpoint, "--json", "--concurrency", "1", "--runs", "1",
                         "--requests-per-stream", "1", "--warmup", "0", "--prompt-tokens", "16", "--output-tokens", "4")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["config"]["server_version"] == doc["receipt"]["engine"]["vllm_version"] == "stub"


def test_requests_that_fail_mid_run_are_worded_one_way_by_either_method(tmp_path):
    """Issue 47: the closed loop said "at concurrency 2, run 1: 1 of 2 requests failed; the first: ..." where
    llama-benchy said "2 request(s) of cell ... failed: ... (and 1 more)"; both now say where, how many of how many,
    and the first one's error (endpoint.requests_failed)."""
    # The closed loop: a calibration probe, a warm-up and c=1's 4 requests answer; then every request fails.
    with running_stub(ttft=0.01, itl=0.001, fail_after=6) as url:
        ours = run_cli("bench", "--url", url, "--json", "--concurrency", "1,2", "--runs", "1", "--prompt-tokens", "16",
                       "--output-tokens", "4", timeout=120)
    # llama-benchy: 3 prompt probes, the coherence question, cell c=1's warm-up and run; then HTTP 500s.
    with running_stub(ttft=0.01, itl=0.001, fail_after=6) as url:
        theirs = benchy(tmp_path, url, "--pp", "32", "--tg", "4", "--concurrency", "1", "2", "--runs", "1", "--json")
    assert (ours.returncode, theirs.returncode) == (1, 1), (ours.stderr, theirs.stderr)
    said = [json.loads(ours.stdout)["error"], json.loads(theirs.stdout)["sparkcluster"]["error"]]
    wording = r"(at concurrency 2, run 1|cell d=0 pp=32 tg=4 c=2): 2 of 2 requests failed; the first: HTTP 500: "
    assert [re.match(wording, s["message"]) is not None for s in said] == [True, True], said
