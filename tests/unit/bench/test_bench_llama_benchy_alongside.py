"""`bench --method llama-benchy` at par with the own method in what surrounds its figures, its own table, JSON keys
and CSV left exactly llama-benchy's: the grid fitted to the served context before any request (the default --pp
halved, a grid given that cannot fit refused with exit 2 naming the largest that fits, where llama-benchy itself
would send it and get a 400 per request), and the decode budget and the GPUs at the end under its table and under
its `sparkcluster` key, from the one helper the own method uses (bench/alongside.py)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from sparkcluster.bench import cli as bench_cli
from sparkcluster.bench.context import DoesNotFit
from sparkcluster.bench.figures import Metric
from sparkcluster.bench.methods.llama_benchy import cli as llama_benchy_cli
from sparkcluster.bench.methods.llama_benchy.arithmetic import BenchmarkRun, itl_by_concurrency
from sparkcluster.bench.methods.llama_benchy.fit import Fitted, fit_grid
from sparkcluster.bench.methods.llama_benchy.formats import JSON_KEYS
from sparkcluster.bench.methods.llama_benchy.schedule import Cell, cells
from sparkcluster.cli import build_parser
from sparkcluster.engine.command import Command
from sparkcluster.engine.transport import Result
from tests.support.openai_stub import running_stub
from tests.support.bench import PAIR_US, RECORD, Head, connect_to
from tests.support.bench import benchy, corpus

# ---- the grid and the served context ----------------------------------------------------------------------------


def test_the_default_pp_is_halved_once_for_the_whole_grid_and_tg_kept():
    found = fit_grid(cells((0, 128), (2048,), (32,), (1, 2)), 512, pp_given=False)
    # depth 128 leaves 384 of 512, 75% of it 288 for pp + 32: pp halved from 2048 to 256 (512 + 32 > 288)
    assert {(c.depth, c.pp, c.tg) for c in found.cells} == {(0, 256, 32), (128, 256, 32)}
    assert [c.concurrency for c in found.cells] == [1, 2, 1, 2]  # llama-benchy's order kept
    assert found.note == ("the served context is 512 tokens (max_model_len): pp 256, the default 2048 halved to fit "
                          "beside depth 128 and tg 32; --pp sets it")


@pytest.mark.parametrize("grid, context", [
    (cells((0,), (2048,), (32,), (1,)), None),  # the server lists no context: nothing to check
    (cells((0,), (2048,), (32,), (1,)), 131072),  # it fits as it is
])
def test_a_grid_that_fits_or_a_context_not_listed_is_kept(grid, context):
    assert fit_grid(grid, context, pp_given=False) == Fitted(tuple(grid), None)


def test_a_pp_given_that_cannot_fit_is_refused_naming_the_largest_that_fits():
    with pytest.raises(DoesNotFit) as e:
        fit_grid(cells((0, 128), (64, 600), (16,), (1,)), 512, pp_given=True)
    assert e.value.exit_code == 2
    assert e.value.message == (
        "the cell d=128 pp=600 tg=16 c=1 cannot fit the served context: the server's max_model_len is 512 tokens "
        "(its /v1/models), and a request's depth, prompt and output (128 + 600 + 16 = 744 tokens) must fit in it "
        "(2 of 4 cells pass it); llama-benchy would send them anyway, each refused (HTTP 400) or its output cut "
        "short of --tg")
    assert e.value.fix == ("the largest --pp that fits at --depth 128 with --tg 16 is 368; or serve the model with "
                           "--max-model-len 744 or more")


def test_a_depth_past_the_context_names_the_largest_depth():
    with pytest.raises(DoesNotFit) as e:  # the default pp halved to its floor (64) cannot make room beside it
        fit_grid(cells((600,), (2048,), (32,), (1,)), 512, pp_given=False)
    assert e.value.message.startswith("the cell d=600 pp=64 tg=32 c=1 cannot fit")
    assert e.value.fix.startswith("the largest --depth that fits with --pp 64 and --tg 32 is 416;")


def test_a_deep_cell_is_given_the_room_its_depth_leaves_and_no_prompt_of_a_few_tokens():
    # Failed before: the spare share was taken off the whole context before the depth: at depth 3000 of 4096 the
    # default pp fell to 32 though 512 fits with room; at depth 4000 to a 1-token prompt, measured as such.
    found = fit_grid(cells((0, 3000), (2048,), (32,), (1,)), 4096, pp_given=False)
    assert {c.pp for c in found.cells} == {512}  # 75% of the 1096 left: 822 for pp + 32
    with pytest.raises(DoesNotFit, match="the cell d=4000 pp=64 tg=32 c=1 cannot fit"):
        fit_grid(cells((0, 4000), (2048,), (32,), (1,)), 4096, pp_given=False)


def test_a_profiles_grid_is_never_changed_only_refused():
    arena = [Cell(d, 2048, 128, c) for d in (0, 4096) for c in (1, 2)]
    with pytest.raises(DoesNotFit) as e:
        fit_grid(arena, 4096, pp_given=False, profile="arena-v2")
    assert e.value.message.startswith("profile arena-v2's cell d=4096 pp=2048 tg=128 c=1 cannot fit")
    assert e.value.fix == ("serve the model with --max-model-len 6272 or more, or run a profile YAML whose depths "
                           "fit")
    assert fit_grid(arena, 8192, pp_given=False, profile="arena-v2").cells == tuple(arena)


def stub_requests(url: str) -> int:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10) as answer:
        return int(float(next(line.split()[1] for line in answer.read().decode().splitlines()
                              if line.startswith("stub:requests_total"))))


def test_llama_benchys_defaults_against_a_512_token_context_are_fitted_and_measured(tmp_path):
    """Failed before: pp 2048 sent as llama-benchy sends it, a 400 per request, exit 1."""
    with running_stub(ttft=0.01, itl=0.001, max_model_len=512) as url:
        result = benchy(tmp_path, url, "--runs", "1", "--no-warmup", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert list(doc) == [*JSON_KEYS, "sparkcluster"]
    assert [(b["prompt_size"], b["response_size"]) for b in doc["benchmarks"]] == [(256, 32)]
    assert doc["benchmarks"][0]["pp_throughput"]["mean"] > 0
    assert doc["sparkcluster"]["max_model_len"] == 512
    assert doc["sparkcluster"]["receipt"]["bench"]["parameters"]["cells"] == ["d=0 pp=256 tg=32 c=1"]


def test_a_grid_given_past_the_context_is_refused_before_any_request(tmp_path):
    with running_stub(ttft=0.01, itl=0.001, max_model_len=512) as url:
        result = benchy(tmp_path, url, "--pp", "500", "--tg", "32", "--depth", "0", "--json")
        sent = stub_requests(url)
    assert result.returncode == 2, result.stderr
    err = " ".join(result.stderr.split())
    assert "the cell d=0 pp=500 tg=32 c=1 cannot fit the served context: the server's max_model_len is 512" in err
    assert "fix: the largest --pp that fits at --depth 0 with --tg 32 is 480" in err, err
    assert sent == 0  # not the warm-up, not the coherence question: nothing
    doc = json.loads(result.stdout)
    assert doc["benchmarks"] == [] and doc["sparkcluster"]["error"]["message"].startswith("the cell d=0 pp=500")


# ---- the ITL the decode budget reads ----------------------------------------------------------------------------

def tg_entry(concurrency: int, depth: int, rate: float, context_phase: bool = False) -> BenchmarkRun:
    return BenchmarkRun(concurrency, depth, 64, 8, context_phase, tg_req_throughput=Metric(rate, 0.0, (rate,)))


def test_the_itl_is_one_over_the_per_request_tg_at_each_concurrencys_shallowest_depth():
    runs = [tg_entry(1, 4096, 50.0), tg_entry(1, 0, 200.0), tg_entry(1, 0, 100.0), tg_entry(2, 4096, 40.0),
            tg_entry(2, 4096, 9999.0, context_phase=True), BenchmarkRun(4, 0, 64, 1, False)]  # c=4: no tg figure
    found = itl_by_concurrency(runs)
    assert found == [(1, pytest.approx((0.005 + 0.010) / 2)), (2, pytest.approx(0.025))]


# ---- the decode budget and the GPUs at the end, on a served cluster ----------------------------------------------

class BenchyHead(Head):
    """The decode budget's head, asked also for the served model's tokenizer (it has none)."""

    def run(self, command: Command) -> Result:
        if "tokenizer.json" in command.script:
            return Result(command, 1, "", "", 0.01)
        return super().run(command)


def llama_benchy_on_cluster(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            *flags: str) -> str:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with running_stub(ttft=0.01, itl=0.005) as url:
        connect = connect_to(BenchyHead(url, RECORD))
        args = build_parser(["bench"]).parse_args(
            ["bench", "--method", "llama-benchy", "--corpus", str(corpus(tmp_path)), "--pp", "64", "--tg", "8",
             "--concurrency", "1,2", "--runs", "1", "--no-warmup", *flags])
        assert bench_cli.cmd_bench(args, connect) == 0
    return capsys.readouterr().out


def test_the_json_carries_the_budget_and_the_gpus_beside_llama_benchys_keys(capsys, tmp_path, monkeypatch):
    doc = json.loads(llama_benchy_on_cluster(capsys, tmp_path, monkeypatch, "--json"))
    assert list(doc) == [*JSON_KEYS, "sparkcluster"]  # llama-benchy's own keys, and nothing new among them
    assert all("decode_budget" not in b and "gpu_at_end" not in b for b in doc["benchmarks"])
    found = doc["sparkcluster"]["decode_budget"]
    assert (found["tp"], found["all_reduces_per_step"]) == (2, 65) and found["verify"]["latency_us"] == PAIR_US
    tg = {b["concurrency"]: b["tg_req_throughput"]["mean"] for b in doc["benchmarks"]}
    for row in found["rows"]:  # the ITL is llama-benchy's own per-request tg, turned over
        assert row["itl_ms"] == pytest.approx(1000 / tg[row["concurrency"]])
        assert row["share"] == pytest.approx(row["all_reduces_ms"] / row["itl_ms"])
    assert [(r["concurrency"], r["message_bytes"]) for r in found["rows"]] == [(1, 8192), (2, 16384)]
    assert doc["sparkcluster"]["gpu_at_end"]["spark-1"]["temperature_c"] == 71


def test_the_text_prints_them_under_llama_benchys_table(capsys, tmp_path, monkeypatch):
    text = llama_benchy_on_cluster(capsys, tmp_path, monkeypatch)
    lines = text.splitlines()
    assert lines[0].startswith("| model ") and lines[1].startswith("|:--")
    table_end = next(i for i, line in enumerate(lines) if i > 1 and not line.startswith("|"))
    after = "\n".join(lines[table_end:])
    assert "decode budget (TP 2, meta-llama/Meta-Llama-3-8B): 65 all-reduces per step" in after
    assert "c=1: 8 KiB each, 41 us (measured) x 65 = 2.7 ms of a" in after
    assert "c=2: 16 KiB each, 47 us (interpolated) x 65 = 3.1 ms of a" in after
    assert llama_benchy_cli.ITL_SOURCE in after
    assert lines[-1] == "GPUs at the end: spark-1 71 C, 87.6 W, SM 2424 MHz, not throttled"
