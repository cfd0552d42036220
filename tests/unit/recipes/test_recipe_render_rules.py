"""The rendering rules by which a community recipe runs as its own tool runs it (eugr v1 -> eugr's runner, sparkrun
v2 -> sparkrun), each pinned on a small recipe written here: one node starts no Ray and passes no launcher flag;
the launcher a recipe's tool defaults to; solo_only's TP 1; sparkrun's shared-clone folder is no registry; every
registry a repository declares is exposed; a JSON env value passes as written. Nothing connects."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.engine.errors import EXIT_OK
from sparkcluster.recipes import registry
from sparkcluster.recipes.load import load_recipe
from sparkcluster.recipes.types import Mod, Recipe
from sparkcluster.serving.launch import Node, ServeArgs, vllm_serve_argv
from sparkcluster.serving.parallel import choose_launcher

LAUNCHER_FLAGS = ("--distributed-executor-backend", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                  "--headless")

# eugr's v1: a one-node recipe whose command names Ray (eugr's solo mode strips it), TP from the defaults
EUGR_SOLO_RAY = """\
recipe_version: "1"
name: small one
container: vllm-node
defaults: {port: 8000, tensor_parallel: 1}
command: |
  vllm serve org/small --port {port} -tp {tensor_parallel} --distributed-executor-backend ray --max-model-len 512
"""
# eugr's v1, two nodes, no executor backend named: eugr's runner starts no Ray
EUGR_PAIR_NO_BACKEND = """\
recipe_version: "1"
name: pair
container: vllm-node
defaults: {tensor_parallel: 2}
command: vllm serve org/pair -tp {tensor_parallel} --max-model-len 1024
"""
# eugr's v1, solo_only with a TP 2 default (eugr's runner: TP 1 unless --tp)
EUGR_SOLO_ONLY_TP2 = """\
recipe_version: "1"
name: solo
container: vllm-node
solo_only: true
defaults: {tensor_parallel: 2}
env:
  VLLM_JSON_KNOB: '{"placement_group_options": {"strategy": "SPREAD"}}'
command: vllm serve org/solo -tp {tensor_parallel}
"""
SPARKRUN_ONE = """\
recipe_version: "2"
model: org/v2-one
runtime: vllm
defaults: {tensor_parallel: 1, max_model_len: 2048}
"""
SPARKRUN_RAY_PAIR = """\
recipe_version: "2"
model: org/v2-ray
runtime: vllm-ray
defaults: {tensor_parallel: 2}
"""


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def recipe_file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "recipes" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def show(capsys, *argv: str) -> dict:
    assert cli.main(["recipes", "show", "--json", *argv]) == EXIT_OK, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("text", [EUGR_SOLO_RAY, SPARKRUN_ONE])
def test_a_one_node_recipe_runs_vllm_alone_with_no_launcher_flag(tmp_path, capsys, text):
    # Failed before: eugr's kept `--distributed-executor-backend ray` (and a one-node Ray head at serve);
    # sparkrun's got `--distributed-executor-backend mp --nnodes 1 --node-rank 0 --master-addr ... --master-port`.
    doc = show(capsys, str(recipe_file(tmp_path, "one", text)))
    assert doc["nodes"] == 1 and doc["launcher"] == "native" and len(doc["commands"]) == 1
    words = doc["commands"][0].split()
    assert words[:2] == ["vllm", "serve"] and not [w for w in words if w in LAUNCHER_FLAGS], words


def test_asked_for_ray_one_node_still_gets_it(tmp_path, capsys):
    doc = show(capsys, str(recipe_file(tmp_path, "one", EUGR_SOLO_RAY)), "--launcher", "ray")
    assert doc["launcher"] == "ray" and "--distributed-executor-backend ray" in doc["commands"][0]


@pytest.mark.parametrize("text, launcher", [
    (EUGR_PAIR_NO_BACKEND, "native"),  # eugr: no Ray unless the command names it (was: Ray)
    (EUGR_SOLO_RAY.replace("tensor_parallel: 1", "tensor_parallel: 2"), "ray"),  # named: Ray
    (SPARKRUN_RAY_PAIR, "ray"),  # sparkrun: its runtime's launcher
    (SPARKRUN_ONE.replace("tensor_parallel: 1", "tensor_parallel: 2"), "native"),
])
def test_on_several_nodes_the_launcher_is_the_recipes_tools(tmp_path, capsys, text, launcher):
    doc = show(capsys, str(recipe_file(tmp_path, "pair", text)))
    assert doc["nodes"] == 2 and doc["launcher"] == launcher
    backend = "ray" if launcher == "ray" else "mp"
    assert f"--distributed-executor-backend {backend}" in doc["commands"][0]


def test_solo_only_forces_tp_1_unless_the_user_gives_one(tmp_path, capsys):
    # Failed before: TP 2 from the defaults, rendered for 2 nodes of a recipe that refuses more than one.
    path = recipe_file(tmp_path, "solo", EUGR_SOLO_ONLY_TP2)
    doc = show(capsys, str(path))
    assert doc["tp"] == 1 and doc["nodes"] == 1 and "--tensor-parallel-size 1" in doc["commands"][0]
    assert load_recipe(str(path)).max_nodes == 1
    assert load_recipe(str(path), _inputs_tp(2)).tp == 2  # the user's --tp is the user's


def _inputs_tp(tp: int):
    from sparkcluster.recipes.types import Inputs

    return Inputs({"tensor_parallel": str(tp)})


def test_a_json_env_value_passes_as_the_recipe_wrote_it(tmp_path):
    # eugr's runner writes export K="{"a":...}" and bash strips the inner quotes; sparkrun passes it as written.
    recipe = load_recipe(str(recipe_file(tmp_path, "solo", EUGR_SOLO_ONLY_TP2)))
    assert recipe.env["VLLM_JSON_KNOB"] == '{"placement_group_options": {"strategy": "SPREAD"}}'
    assert json.loads(recipe.env["VLLM_JSON_KNOB"]) == {"placement_group_options": {"strategy": "SPREAD"}}


def test_the_serve_line_on_one_native_node_has_no_launcher_flag():
    args = ServeArgs("org/m", 1, 1, 8000, "m", ("--max-model-len", "512"))
    one = vllm_serve_argv(args, "native", Node("spark-1", 0, "10.0.0.1", "10.0.0.1"), 1)
    assert one == ["vllm", "serve", "org/m", "--tensor-parallel-size", "1", "--host", "0.0.0.0", "--port", "8000",
                   "--served-model-name", "m", "--max-model-len", "512"]
    two = vllm_serve_argv(args, "native", Node("spark-1", 0, "10.0.0.1", "10.0.0.1"), 2)
    assert "--nnodes" in two and "--master-addr" in two  # several nodes keep vLLM's own multi-node flags


def test_the_docker_runtime_keeps_ray_where_mods_must_run_before_vllm(tmp_path):
    mod = Mod("fix", tmp_path, "mods/fix")
    modded = Recipe("r", launcher="native", mods=(mod,))
    assert choose_launcher(None, modded, 1, "docker") == "ray"  # mods are run in the container beside Ray
    assert choose_launcher(None, modded, 1, "host") == "native"
    assert choose_launcher(None, modded, 1, None) == "native"
    assert choose_launcher("native", modded, 1, "docker") == "native"  # asked for: serve refuses it, saying why
    assert choose_launcher(None, Recipe("own"), 2, "docker") == "ray"  # sparkcluster's own format: Ray


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(cwd)})


def two_registry_repo(root: Path) -> Path:
    """One repository whose manifest declares two registries, as spark-arena's recipe-registry does."""
    repo = root / "arena"
    (repo / ".sparkrun").mkdir(parents=True)
    (repo / ".sparkrun" / "registry.yaml").write_text(
        "registries:\n  - {name: stable, recipes: stable-recipes}\n  - {name: trial, recipes: trial-recipes}\n")
    for folder, model in (("stable-recipes", "org/stable"), ("trial-recipes", "org/trial")):
        (repo / folder).mkdir()
        (repo / folder / f"{folder.split('-')[0]}-one.yaml").write_text(f"recipe_version: '2'\nmodel: {model}\n")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "recipes", cwd=repo)
    return repo


def test_every_registry_a_repository_declares_is_exposed(tmp_path, capsys):
    # Failed before: only the first (`stable`) was reachable; @trial/... was "no registry named 'trial'".
    repo = two_registry_repo(tmp_path)
    assert cli.main(["recipes", "add-registry", "stable", str(repo)]) == EXIT_OK
    assert load_recipe("@stable/stable-one").model == "org/stable"
    assert load_recipe("@trial/trial-one").model == "org/trial"
    assert load_recipe("trial-one").registry == "trial"  # a bare name: in one registry, not two
    assert registry.registries()["trial"].origin == "declared by stable"
    # the config records what the user added; the declared sibling follows it (no clone of its own)
    assert set(registry.registries()) == {"stable", "trial"}
    assert "trial" not in registry.config_file().read_text()
    assert set(registry.update()) == {"stable"}


def test_sparkruns_shared_clone_folder_is_no_registry(tmp_path, monkeypatch):
    # Failed before: `_url_<hash>` was a registry, so every recipe of the clone it shares was in two registries.
    clones = registry.sparkrun_clones_dir()
    for name in ("stable", "_url_0a1b2c3d"):
        folder = clones / name / "recipes"
        folder.mkdir(parents=True)
        (folder / "only-one.yaml").write_text("recipe_version: '2'\nmodel: org/one\n")
    assert set(registry.registries()) == {"stable"}
    recipe = load_recipe("only-one")
    assert recipe.registry == "stable" and recipe.model == "org/one"


def test_the_conformance_benchmark_passes_a_match_and_names_each_difference(tmp_path, monkeypatch, capsys):
    """benchmarks/recipe_conformance.py on a tree of one registry repository (written here): the render that
    matches its expected entry passes by file and by @REG/NAME; one whose expected TP, env and node count differ
    fails with each difference named; exit 1."""
    from benchmarks import recipe_conformance

    repo = tmp_path / "tree" / "lab-recipes"
    (repo / ".sparkrun").mkdir(parents=True)
    (repo / ".sparkrun" / "registry.yaml").write_text("registries:\n  - {name: lab, recipes: recipes}\n")
    recipe_file(repo, "one", SPARKRUN_ONE)
    recipe_file(repo, "solo", EUGR_SOLO_ONLY_TP2)
    knob = '{"placement_group_options": {"strategy": "SPREAD"}}'
    expected = [
        {"file": "lab-recipes/recipes/one.yaml", "ref": "@lab/one", "nodes": 1, "model": "org/v2-one",
         "flags": {"max-model-len": "2048", "host": "0.0.0.0", "port": "8000"}, "env": {}},
        {"file": "lab-recipes/recipes/solo.yaml", "ref": "@lab/solo", "nodes": 2, "model": "org/solo",
         "flags": {"tensor-parallel-size": "2", "host": "0.0.0.0", "port": "8000"},
         "env": {"VLLM_JSON_KNOB": knob.replace('"', "")}},
    ]
    (tmp_path / "expected.json").write_text(json.dumps({"entries": expected}))
    monkeypatch.setattr("sys.argv", ["recipe_conformance.py", str(tmp_path / "tree"), "--expected",
                                     str(tmp_path / "expected.json"), "--json"])
    assert recipe_conformance.main() == 1
    doc = json.loads(capsys.readouterr().out)
    by_file = {r["file"]: r for r in doc["recipes"]}
    assert by_file["lab-recipes/recipes/one.yaml"]["pass"] and doc["expected_pass"] == 1, doc
    solo = by_file["lab-recipes/recipes/solo.yaml"]
    assert solo["by_file"] == solo["by_ref"] and not solo["pass"]  # the same differences by either path
    assert "--tensor-parallel-size 1, expected 2" in solo["by_file"]
    assert "rendered for 1 node(s), the recipe is for 2" in solo["by_file"]
    assert any(d.startswith("env VLLM_JSON_KNOB=") for d in solo["by_file"])
