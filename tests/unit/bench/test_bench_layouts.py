"""Issue 40, `bench --layouts`: the layouts named and refused before anything connects, the best layout per
concurrency, the table and --json shapes, and the state that lets a run cut short resume without serving a measured
layout again."""

from __future__ import annotations

import json
import shlex

import pytest
from rich.console import Console

from sparkcluster import cli
from sparkcluster.bench.cli import cmd_bench
from sparkcluster.bench.layouts import choice, report, state
from sparkcluster.bench.layouts import cli as layouts_cli
from sparkcluster.bench.layouts.run import measure_layouts
from sparkcluster.bench.metrics import ServerSide
from sparkcluster.engine.cliapp import selected_inventory
from sparkcluster.engine.errors import SparkclusterError, UsageError
from sparkcluster.serving.cli import options, sized
from sparkcluster.serving.layout import Layout
from sparkcluster.serving.phases import ServeOptions
from tests.support.bench_layouts import Cluster, INPUTS, PP2, TP2, TWO_REPLICAS, inventory_file, measured, on_cluster, planned, row


# ---- naming and refusing layouts, before anything connects ------------------------------------------------------

def test_the_kinds_are_read_each_once_in_the_order_given():
    assert choice.parse_kinds(["tp,replicas", "pp", "tp"]) == ("tp", "replicas", "pp")


def test_an_unknown_kind_is_refused_naming_it_and_the_kinds():
    with pytest.raises(UsageError) as e:
        choice.parse_kinds(["tp,tensor"])
    assert e.value.exit_code == 2
    assert e.value.message == "--layouts tp,tensor: 'tensor' is not one of tp, pp, replicas"
    assert e.value.fix == "e.g. --layouts tp,replicas"


def test_each_kind_is_the_layout_it_means_on_the_selected_nodes():
    assert choice.layouts_for(("tp", "pp", "replicas"), 2) == (TP2, PP2, TWO_REPLICAS)
    assert choice.layouts_for(("tp",), 1) == (Layout(1, 1, 1),)


def test_pp_and_replicas_on_one_node_are_refused_before_anything_connects(tmp_path, capsys):
    inventory = inventory_file(tmp_path, 1)
    code = cli.main(["bench", "-i", str(inventory), "--layouts", "tp,replicas", "--model", "org/m",
                     "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert "--layouts tp,replicas on 1 node: replicas needs 2 nodes or more" in err, err
    assert "select 2 or more nodes (inventory or --limit)" in err
    assert not (tmp_path / "out").exists()


CLUSTER_ONLY = """\
recipe_version: "2"
model: org/big
min_nodes: 2
"""


def test_a_layout_the_recipe_cannot_serve_is_refused_naming_the_layout_and_how_to_leave_it_out(tmp_path, capsys):
    recipe = tmp_path / "big.yaml"  # sparkrun's min_nodes 2: too large for one Spark, so not one replica per node
    recipe.write_text(CLUSTER_ONLY)
    code = cli.main(["bench", "-i", str(inventory_file(tmp_path, 2)), "--layouts", "tp,replicas", "--recipe",
                     str(recipe), "--runtime", "docker", "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert ("--layouts replicas (2 replicas of TP 1 x PP 1 behind a router): recipe big needs at least 2 nodes per "
            "engine") in err, err
    assert "or measure the other layouts (leave replicas out of --layouts)" in err, err


def test_a_launcher_one_layout_cannot_take_is_refused_naming_that_layout(tmp_path, capsys):
    code = cli.main(["bench", "-i", str(inventory_file(tmp_path, 2)), "--layouts", "tp,replicas", "--model", "org/m",
                     "--launcher", "ray", "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert "--layouts replicas (2 replicas of TP 1 x PP 1 behind a router): --launcher ray with 2 replicas" in err, err


@pytest.mark.parametrize("flags, named", [
    (["--runtime", "host"], "--runtime: serve's flags, which bench reads only with --layouts"),
    (["--recipe", "default", "--no-verify"], "--recipe, --no-verify: serve's flags"),
    (["--layouts", "tp", "--url", "http://h:8000"], "--url with --layouts: --layouts serves each layout itself"),
    (["--layouts", "tp", "--csv", "x.csv"], "--csv with --layouts"),
    (["--layouts", "tp", "--pp", "512"], "--pp: not a flag of --method sustained"),
])
def test_flags_that_would_do_nothing_are_refused(tmp_path, capsys, flags, named):
    code = cli.main(["bench", "-i", str(inventory_file(tmp_path, 2)), *flags])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and named in err, err


# ---- the best layout per concurrency, the table and the document -------------------------------------------------

def runs() -> list[state.Measured]:
    # c=1: TP 2 decodes fastest per stream; c=8: two replicas give more in all; replicas' c=1 failed a request.
    return [measured("tp", TP2, [row(1, 40.0, 0.050, 0.025), row(8, 200.0, 0.200, 0.040)]),
            measured("replicas", TWO_REPLICAS, [row(1, 45.0, 0.040, 0.022, errors=1), row(8, 260.0, 0.150, 0.030)])]


def test_the_best_layout_per_concurrency_is_the_most_generation_tokens_and_never_a_row_with_errors():
    assert report.best_per_concurrency(runs()) == {1: "tp", 8: "replicas"}
    tie = [measured("pp", PP2, [row(1, 40.0, 0.05, 0.02)]), measured("tp", TP2, [row(1, 40.0, 0.05, 0.02)])]
    assert report.best_per_concurrency(tie) == {1: "pp"}  # the first given wins a tie


def test_the_table_is_concurrency_by_layout_with_the_best_marked():
    console = Console(width=120, record=True, color_system=None)
    console.print(report.render(runs(), (1, 8)))
    text = console.export_text()
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    body = [line for line in lines if line[:1].isdigit() or line.startswith(("tp", "replicas"))]
    assert body == ["1 tp (tp2) 40.0 50 ms 25 ms 0 <- best",
                    "replicas (2x tp1) 45.0 40 ms 22 ms 1",
                    "8 tp (tp2) 200 200 ms 40 ms 0",
                    "replicas (2x tp1) 260 150 ms 30 ms 0 <- best"], text


def test_the_document_holds_layouts_with_rows_best_and_the_wall_time_split():
    doc = report.document(runs(), {"model": "m"}, stage_s=12.5)
    assert [(entry["layout"], [r["concurrency"] for r in entry["rows"]]) for entry in doc["layouts"]] == [
        ("tp", [1, 8]), ("replicas", [1, 8])]
    assert doc["layouts"][1]["shape"] == {"name": "2x tp1", "replicas": 2, "tp": 1, "pp": 1}
    assert doc["best"] == {"1": "tp", "8": "replicas"}
    assert doc["wall_s"] == {"stage": 12.5, "serve": 120.0, "measure": 40.0}
    assert doc["cpu_vllm"] is None
    json.dumps(doc)  # one JSON document


def test_figures_of_a_cpu_vllm_are_said_to_be_so():
    cpu = [measured("tp", TP2, [row(1, 4.0, 0.5, 0.2)], build="0.32.0+cpu")]
    note = report.document(cpu, {}, 0.0)["cpu_vllm"]
    assert note.startswith("these figures are a CPU build of vLLM's (vLLM 0.32.0+cpu, as the simulator runs it)")
    assert "not which layout is fastest on DGX Sparks" in note


# ---- the resume state ----------------------------------------------------------------------------------------------


def test_a_run_cut_short_resumes_without_serving_a_measured_layout_again(tmp_path):
    path = tmp_path / state.STATE_FILE
    first = Cluster(fail_on="replicas")
    layouts = planned("tp", "replicas")
    with pytest.raises(SparkclusterError):
        measure_layouts(layouts, state.load(path, INPUTS), first.serve, first.measure, lambda text: None)
    assert first.served == ["tp"]  # then replicas failed to serve: the run stopped there
    kept = json.loads(path.read_text())
    assert [d["layout"] for d in kept["done"]] == ["tp"] and kept["inputs"] == INPUTS

    said: list[str] = []
    again = Cluster()
    resumed = state.load(path, INPUTS)
    measure_layouts(layouts, resumed, again.serve, again.measure, said.append)
    assert again.served == ["replicas"]  # tp was not served again
    assert said[0] == f"tp (TP 2 x PP 1): measured before, kept from {path}"
    assert list(resumed.done) == ["tp", "replicas"]
    tp = resumed.done["tp"]
    assert tp.rows == (row(1, 50.0, 0.1, 0.02),) and tp.server == (ServerSide(0.1, None, 0, 32, 64),)
    assert (tp.server_version, tp.vllm_build) == ("0.32.0", "0.32.0+cpu") and tp.phases == {"launch": 1.0} and tp.shape == TP2
    assert state.load(path, INPUTS).done == resumed.done  # what was written reads back the same


def test_a_state_of_other_settings_is_refused_naming_what_differs(tmp_path):
    path = tmp_path / state.STATE_FILE
    state.load(path, INPUTS).record(measured("tp", TP2, [row(1, 40.0, 0.05, 0.02)]))
    with pytest.raises(UsageError) as e:
        state.load(path, {**INPUTS, "concurrency": [1, 2]})
    assert e.value.exit_code == 2
    assert f"{path} holds layouts measured with other settings (concurrency [1, 8], now [1, 2])" in e.value.message
    assert e.value.fix == (f"run with the same settings to resume, or give another --out, or delete {path} to "
                           "measure every layout afresh")


@pytest.mark.parametrize("text", ["{not json", '{"version": 99, "inputs": {}, "done": []}',
                                  '{"version": 1, "inputs": {}, "done": [{"layout": "tensor"}]}'])
def test_a_state_file_that_does_not_read_is_refused(tmp_path, text):
    path = tmp_path / state.STATE_FILE
    path.write_text(text)
    with pytest.raises(UsageError, match="not a bench --layouts state file") as e:
        state.load(path, {})
    assert f"delete {path}" in e.value.fix


# ---- the command: a run cut short prints what it measured, and the same command finishes it -----------------------


def test_the_command_cut_short_shows_what_it_measured_and_the_same_command_measures_only_the_rest(
        tmp_path, capsys, monkeypatch):
    cluster = Cluster(fail_on="replicas")
    connect = on_cluster(monkeypatch, cluster, staged_s=3.0)
    out = tmp_path / "out"
    argv = ["bench", "-i", str(inventory_file(tmp_path, 2)), "--layouts", "tp,replicas", "--model", "org/m",
            "--concurrency", "1", "--out", str(out)]

    def bench(*more: str) -> int:
        args = cli.build_parser(["bench"]).parse_args([*argv, *more])
        args.remote = []
        return cmd_bench(args, connect)

    assert bench() == 1
    printed = capsys.readouterr()
    table = [" ".join(line.split()) for line in printed.out.splitlines()]
    assert "1 tp (tp2) 50.0 100 ms 20 ms 0 <- best" in table, printed.out
    err = " ".join(printed.err.split())
    assert (f"error: replicas: vLLM did not start fix: read its log; the layouts measured are kept in {out}: the same command "
            "again measures only the rest") in err, err
    assert cluster.served == ["tp"]

    cluster.fail_on = None
    assert bench("--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert cluster.served == ["tp", "replicas"]  # tp was not served again
    assert [(entry["layout"], entry["shape"]["name"]) for entry in doc["layouts"]] == [("tp", "tp2"),
                                                                                       ("replicas", "2x tp1")]
    assert doc["best"] == {"1": "replicas"} and doc["wall_s"]["stage"] == 3.0
    assert doc["cpu_vllm"].startswith("these figures are a CPU build of vLLM's (vLLM 0.32.0+cpu")
    assert json.loads((out / "layouts.json").read_text())["layouts"] == doc["layouts"]


# ---- the serve line of the best layout: pasted, it serves that layout as measured (README audit round 3, item 4) ---

def test_the_serve_line_printed_for_the_best_layout_serves_it_as_measured(tmp_path, capsys, monkeypatch):
    """The inventory lists the model (the bundled `default` recipe names none) and says `replicas: 2`, which a bare
    `serve --tp 2` would take: the line says TP, PP and replicas, the inventory, the model and the vLLM flags, and
    reads the API key from a variable rather than printing it. Parsed by serve's own parser and sized on the same
    inventory, it is the layout bench served, with the same model and flags."""
    inventory = tmp_path / "inv.yml"
    inventory.write_text("name: t\nvars: {user: spark, replicas: 2}\nhosts:\n"
                         "  spark-1: {address: 192.168.1.11, role: head}\n"
                         "  spark-2: {address: 192.168.1.12, role: worker}\nmodels: [org/m]\n")
    connect = on_cluster(monkeypatch, Cluster(), staged_s=1.0)
    served: dict[str, ServeOptions] = {}
    monkeypatch.setattr(layouts_cli, "stage_once", lambda session, todo, emit: served.update(
        {item.kind: item.options for item in todo}) or 1.0)
    args = cli.build_parser(["bench"]).parse_args(["bench", "-i", str(inventory), "--layouts", "replicas,tp",
                                                    "--concurrency", "1", "--out", str(tmp_path / "out")])
    args.remote = ["--max-model-len", "512", "--api-key", "sk-secret"]
    assert cmd_bench(args, connect) == 0
    out = capsys.readouterr().out
    said = next(line for line in out.splitlines() if line.startswith("serve the best: "))
    assert "sk-secret" not in out
    line = said.split("`")[1]  # tp won (the fake cluster measures the later layout faster)
    assert said.startswith("serve the best: tp at c=1: `sparkcluster serve --tp 2 --pp 1 --replicas 1 ")
    assert said.endswith('-- --max-model-len 512 --api-key "$API_KEY"` (with API_KEY set: a secret\'s value is '
                         'never printed)')

    argv = [w.replace("$API_KEY", "sk-secret") for w in shlex.split(line)]  # as the shell expands it
    assert argv[:2] == ["sparkcluster", "serve"]
    remote = argv[argv.index("--") + 1:]
    serve_args = cli.build_parser(["serve"]).parse_args(argv[1:argv.index("--")])
    serve_args.remote = remote
    pasted = sized(options(serve_args), selected_inventory(serve_args))
    assert pasted.layout == TP2 == served["tp"].layout
    assert pasted.serve_args() == served["tp"].serve_args()  # model, TP, PP, port, name, flags, env
    assert pasted.serve_args().model == "org/m"
    assert (pasted.runtime, pasted.launcher, pasted.image, pasted.recipe) == (
        served["tp"].runtime, served["tp"].launcher, served["tp"].image, served["tp"].recipe)
