"""Recipes as data, in the three formats: a recipe file written in the test, in; what each node runs (the vLLM
line per rank, the env, the mods) or the refusal (exit 2, file:line, the fix), out. Nothing connects."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkcluster import cli
from sparkcluster.engine.errors import EXIT_OK, EXIT_USAGE, UsageError
from sparkcluster.engine.inventory import Inventory, load_inventory
from sparkcluster.recipes.load import load_recipe
from sparkcluster.recipes.types import Inputs, ModPlace
from sparkcluster.serving.layout import Layout, LayoutAsk
from sparkcluster.serving.parallel import size_layout
from tests.support.recipes import git, private_home, registry_repo, show, two_node_inventory  # noqa: F401 (fixtures)

EUGR_V1 = """\
recipe_version: "1"
name: Tiny Llama
description: a test recipe in eugr's format
model: local/tiny-llama
container: vllm-node
container: vllm-node-tf5
mods:
  - mods/drop-template
defaults:
  port: 8000
  host: 0.0.0.0
  tensor_parallel: 2
  max_model_len: 384
  gpu_memory_utilization: 0.7
  num_spec: 2
env:
  VLLM_RECIPE_MARK: 7
  PLAIN: text
command: |
  vllm serve local/tiny-llama \\
      --host {host} --port {port} \\
      -tp {tensor_parallel} \\
      --max-model-len {max_model_len} \\
      --gpu-memory-utilization {gpu_memory_utilization} \\
      --chat-template tiny.jinja \\
      --speculative-config '{{"method":"ngram","num_speculative_tokens":{num_spec}}}' \\
      --distributed-executor-backend ray
"""

SPARKRUN_BASE = """\
model: org/base-model
runtime: vllm
container: ghcr.io/example/vllm:1
defaults:
  port: 8001
  tensor_parallel: 1
  pipeline_parallel: 3
  max_model_len: 4096
  enforce_eager: true
  served_model_name: "{model}-served"
  tool_call_parser: hermes
env:
  BASE_ENV: "1"
"""
SPARKRUN_V2 = """\
recipe_version: "2"
include: base
model: org/pp-model
min_nodes: 3
max_nodes: 3
metadata: {description: three stages}
defaults:
  max_model_len: 2048
overrides:
  - when: {nodes: 3}
    defaults: {max_num_seqs: 4}
    env: {OVERRIDDEN: "yes"}
"""


def eugr_tree(root: Path, recipe: str = EUGR_V1, run_sh: str | None = "echo hi > \"$WORKSPACE_DIR/tiny.jinja\"\n") -> Path:
    """An eugr checkout's shape: recipes/x.yaml naming mods/NAME from the repository's root."""
    (root / "recipes").mkdir(parents=True)
    (root / "mods" / "drop-template").mkdir(parents=True)
    if run_sh is not None:
        (root / "mods" / "drop-template" / "run.sh").write_text("#!/bin/sh\n" + run_sh)
    path = root / "recipes" / "tiny.yaml"
    path.write_text(recipe)
    return path


def test_eugr_v1_quirks_render_into_each_nodes_line(tmp_path, monkeypatch, capsys, no_connection):
    path = eugr_tree(tmp_path)
    code, doc, err = show(monkeypatch, capsys, str(path), "--launcher", "native")
    assert code == EXIT_OK, err
    # container twice: the last wins, and the warning names both lines.
    assert doc["image"] == "vllm-node-tf5"
    assert f"{path}:6: 'container' is given twice (lines 5 and 6); the last one wins" in err
    assert doc["env"] == {"VLLM_RECIPE_MARK": "7", "PLAIN": "text"}  # an int env value, as text
    assert (doc["tp"], doc["pp"], doc["nodes"], doc["format"]) == (2, 1, 2, "eugr v1")
    assert doc["mods"] == [{"name": "drop-template", "from": str(tmp_path / "mods" / "drop-template"),
                            "given": "mods/drop-template"}]
    spec = "'{\"method\":\"ngram\",\"num_speculative_tokens\":2}'"  # doubled braces are literal JSON
    common = ("--host 0.0.0.0 --port 8000 --served-model-name local/tiny-llama --max-model-len 384 "
              f"--gpu-memory-utilization 0.7 --chat-template tiny.jinja --speculative-config {spec}")
    native = "--distributed-executor-backend mp --nnodes 2"
    assert doc["commands"] == [
        f"vllm serve local/tiny-llama --tensor-parallel-size 2 {native} --node-rank 0 --master-addr "
        f"'<head fabric ip>' --master-port 29501 {common}",
        f"vllm serve local/tiny-llama --tensor-parallel-size 2 {native} --node-rank 1 --master-addr "
        f"'<head fabric ip>' --master-port 29501 --headless --max-model-len 384 --gpu-memory-utilization 0.7 "
        f"--chat-template tiny.jinja --speculative-config {spec}"]
    # Without --launcher the recipe's own `--distributed-executor-backend ray` chooses Ray.
    code, doc, _ = show(monkeypatch, capsys, str(path))
    assert doc["launcher"] == "ray" and "--distributed-executor-backend ray" in doc["commands"][0]


def test_the_override_order(tmp_path, monkeypatch, capsys, no_connection):
    """recipe defaults < our options (--tp, --port) < --set < the extra flags after --."""
    path = eugr_tree(tmp_path)
    code, doc, err = show(monkeypatch, capsys, str(path), "--tp", "1", "--pp", "2", "--set", "max_model_len=300",
                          "--set", "num_spec=5", "--", "--gpu-memory-utilization", "0.5")
    assert code == EXIT_OK, err
    line = doc["commands"][0]
    assert (doc["tp"], doc["pp"]) == (1, 2) and "--tensor-parallel-size 1 --pipeline-parallel-size 2" in line
    assert "--max-model-len 300" in line and '"num_speculative_tokens":5' in line
    assert "--gpu-memory-utilization 0.5" in line and "0.7" not in line
    # --set of the template's own placeholder beats our option of the same meaning.
    code, doc, _ = show(monkeypatch, capsys, str(path), "--tp", "1", "--set", "tensor_parallel=2")
    assert doc["tp"] == 2


def test_sparkrun_v2_without_command_builds_the_line_from_defaults(tmp_path, monkeypatch, capsys, no_connection):
    (tmp_path / "base.yaml").write_text(SPARKRUN_BASE)
    path = tmp_path / "pp3.yaml"
    path.write_text(SPARKRUN_V2)
    code, doc, err = show(monkeypatch, capsys, str(path), "--launcher", "native", "--tp", "1", "--pp", "3")
    assert code == EXIT_OK, err
    assert (doc["model"], doc["image"], doc["tp"], doc["pp"], doc["nodes"]) == \
        ("org/pp-model", "ghcr.io/example/vllm:1", 1, 3, 3)
    assert doc["env"] == {"BASE_ENV": "1", "OVERRIDDEN": "yes"}  # the include's env, then the matching override's
    head = doc["commands"][0]
    assert head.startswith("vllm serve org/pp-model --tensor-parallel-size 1 --pipeline-parallel-size 3 "
                           "--distributed-executor-backend mp --nnodes 3 --node-rank 0")
    # sparkrun's flag map: mapped keys only, bools bare, {model} substituted inside a default
    assert "--port 8001 --served-model-name org/pp-model-served" in head
    assert head.endswith("--max-model-len 2048 --max-num-seqs 4 --enforce-eager --tool-call-parser hermes")
    assert [line.split("--node-rank ")[1][0] for line in doc["commands"]] == ["0", "1", "2"]


def test_sparkrun_v2_node_bounds_refuse_other_selections():
    recipe = load_recipe_text("recipe_version: '2'\nmodel: a/b\nmin_nodes: 3\nmax_nodes: 3\n")
    three = inventory(3)
    assert size_layout(LayoutAsk(None, 1, 3), three, recipe) == Layout(1, 1, 3)
    assert size_layout(LayoutAsk(None, None, 3), three, recipe) == Layout(1, 1, 3)  # TP from the nodes and PP
    with pytest.raises(UsageError, match="needs at least 3 nodes"):
        size_layout(LayoutAsk(), inventory(2), recipe)
    with pytest.raises(UsageError, match="runs on at most 3 node"):
        size_layout(LayoutAsk(), inventory(4), recipe)
    with pytest.raises(UsageError, match=r"TP 2 x PP 3 needs 6 GPUs"):
        size_layout(LayoutAsk(None, 2, 3), three, recipe)
    solo = load_recipe_text('recipe_version: "1"\nname: s\ncontainer: c\nsolo_only: true\ncommand: vllm serve a/b\n')
    with pytest.raises(UsageError, match="solo_only") as e:
        size_layout(LayoutAsk(), inventory(2), solo)
    assert "--limit spark-1" in e.value.fix
    cluster = load_recipe_text('recipe_version: "1"\nname: s\ncontainer: c\ncluster_only: true\ncommand: vllm serve a/b\n')
    with pytest.raises(UsageError, match="cluster_only"):
        size_layout(LayoutAsk(), inventory(1), cluster)


REFUSALS = [
    # (recipe text, the line named, what the message says, what the fix says)
    ('recipe_version: "7"\nmodel: a/b\n', 1, "recipe_version '7' is no format", 'recipe_version: "1"'),
    ("model: a/b\nruntime: sglang\ncommand: python -m sglang.launch_server\n", 2, "runtime 'sglang' is not vLLM",
     "use sparkrun"),
    ("model: a/b\ncommand: sglang serve a/b\n", 1, "runtime 'sglang' is not vLLM", "sparkrun"),
    ('recipe_version: "1"\nname: x\ncontainer: c\ncommand: python serve.py --model a\n', 4,
     "must start `vllm serve MODEL`", "vllm serve ORG/NAME"),
    ('recipe_version: "1"\nname: x\ncontainer: c\n\ncommand: vllm serve a/b --max-model-len {max_len}\n', 5,
     "needs a value for {max_len}", "--set max_len=VALUE"),
    ('recipe_version: "1"\nname: x\ncontainer: c\ncommand: vllm serve a/b --x {bad\n', 4,
     "the command template cannot be read", "write a literal brace twice"),
    ("model: a/b\nlayout: {ranks: [0, 1]}\n", 2, "layout places containers", "--tp and --pp"),
    ("model: a/b\npre_exec: ['pip install x']\n", 2, "pre_exec hooks are not run", "mod"),
    ('recipe_version: "1"\nname: x\ncontainer: c\ncommand: vllm serve a/b && rm -rf /\n', 4, "shell operator", "mod"),
    ('recipe_version: "1"\nname: x\ncommand: vllm serve a/b\n', 1, "needs `container:`", "add `container:`"),
    ("model: a/b\nmin_nodes: two\n", 2, "min_nodes 'two' is not a node count", "min_nodes: 2"),
    ('recipe_version: "1"\nname: x\ncontainer: c\nmods: [mods/nowhere]\ncommand: vllm serve a/b\n', 4,
     "mod 'mods/nowhere' is not found", "next to the recipe"),
    ('flags: {--x: 1}\nflags: {--y: 2}\n', 2, "'flags' is given twice", "keep each key once"),
    ('foo: 1\n', 1, "unknown key 'foo'", "sparkrun recipes `recipe_version: \"2\"`"),
]


@pytest.mark.parametrize("text, line, message, fix", REFUSALS)
def test_refusals_name_file_line_and_fix_before_connecting(tmp_path, monkeypatch, capsys, no_connection,
                                                           text, line, message, fix):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        load_recipe(str(path))
    assert e.value.message.startswith(f"{path}:{line}: ") and message in e.value.message, e.value.message
    assert fix in e.value.fix
    code, _, err = show(monkeypatch, capsys, str(path))
    assert code == EXIT_USAGE and message in err


def test_a_mod_without_run_sh_is_refused(tmp_path):
    path = eugr_tree(tmp_path, run_sh=None)
    with pytest.raises(UsageError, match=r"tiny.yaml:8: mod 'mods/drop-template' .* has no run.sh"):
        load_recipe(str(path))


def test_serve_refuses_an_unfilled_placeholder_with_exit_2_before_connecting(tmp_path, monkeypatch, capsys,
                                                                           no_connection):
    path = tmp_path / "r.yaml"
    path.write_text('recipe_version: "1"\nname: x\ncontainer: c\ncommand: vllm serve a/b --max-num-seqs {seqs}\n')
    inv = tmp_path / "inv.yml"
    inv.write_text("name: t\nvars: {user: spark}\nhosts:\n  spark-1: {address: 10.0.0.1, role: head}\n"
                   "  spark-2: {address: 10.0.0.2, role: worker}\n")
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    code = cli.main(["serve", "-i", str(inv), "--recipe", str(path), "--check"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == EXIT_USAGE and f"{path}:4: the command needs a value for {{seqs}}" in err
    assert "--set seqs=VALUE" in err


def test_a_local_git_registry_added_listed_resolved_and_its_mods_refused_until_trusted(tmp_path, monkeypatch,
                                                                                       capsys, no_connection):
    repo = registry_repo(tmp_path)
    assert cli.main(["recipes", "add-registry", "mine", str(repo)]) == EXIT_OK
    assert "registry mine: cloned, 5 recipe(s), not trusted" in " ".join(capsys.readouterr().out.split())
    assert cli.main(["recipes", "list", "--json"]) == EXIT_OK
    names = [r["name"] for r in json.loads(capsys.readouterr().out)["recipes"]]
    assert "default" in names and "@mine/plain" in names and "@mine/sub/modded" in names
    # by file stem, flat first: @mine/plain is the top-level file, not sub/plain
    assert load_recipe("@mine/plain").model == "a/plain" and load_recipe("@mine/sub/plain").model == "a/deeper"
    assert load_recipe("@mine/twice").model == "a/c"  # a flat .yml hit wins over the deeper one
    # mods from an untrusted registry: refused, naming the registry and both ways to trust it
    with pytest.raises(UsageError) as e:
        load_recipe("@mine/modded")
    assert "registry 'mine', which is not trusted" in e.value.message and "mods/drop-template" in e.value.message
    assert "--trust" in e.value.fix and "recipes add-registry mine URL --trust" in e.value.fix
    trusted = load_recipe("@mine/modded", trust=True)
    assert trusted.mods[0].path.parts[-2:] == ("my-mods", "drop-template") and trusted.registry == "mine"
    code, _, err = show(monkeypatch, capsys, "@mine/modded")
    assert code == EXIT_USAGE and "not trusted" in err
    assert cli.main(["recipes", "add-registry", "mine", str(repo), "--trust"]) == EXIT_OK
    assert load_recipe("@mine/modded").trusted
    assert load_recipe("modded").model == "a/modded"  # unscoped: every registry is searched


def test_an_unscoped_name_in_two_registries_is_an_error(tmp_path):
    repo = registry_repo(tmp_path)
    from sparkcluster.recipes import registry as recipe_registry
    recipe_registry.add("one", str(repo), False)
    recipe_registry.add("two", str(repo), False)
    with pytest.raises(UsageError, match=r"more than one registry: @one/sub/modded, @two/sub/modded"):
        load_recipe("modded")


def test_a_failing_update_keeps_the_last_good_copy(tmp_path, capsys):
    repo = registry_repo(tmp_path)
    from sparkcluster.recipes import registry as recipe_registry
    reg, _ = recipe_registry.add("mine", str(repo), False)
    subprocess.run(["rm", "-rf", str(repo)], check=True)  # the origin is gone (offline, moved)
    assert cli.main(["recipes", "update"]) == EXIT_OK
    assert "mine: could not be updated" in capsys.readouterr().err and "keeping the last good copy" in \
        recipe_registry.update()["mine"].said
    assert load_recipe("@mine/plain").model == "a/plain"


def test_a_registry_configured_for_sparkrun_is_usable_as_is(tmp_path):
    clone = tmp_path / "cache" / "sparkrun" / "registries" / "eugr"
    eugr_tree(clone)  # sparkrun's eugr registry: recipes/ and mods/
    recipe = load_recipe("@eugr/tiny", trust=True)
    assert recipe.model == "local/tiny-llama" and recipe.mods[0].path == clone / "mods" / "drop-template"
    with pytest.raises(UsageError, match="registry 'eugr', which is not trusted"):
        load_recipe("@eugr/tiny")


# ---- helpers ----------------------------------------------------------------------------------------------
def load_recipe_text(text: str, inputs: Inputs | None = None):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.yaml"
        path.write_text(text)
        return load_recipe(str(path), inputs)


def inventory(n: int) -> Inventory:
    import tempfile
    hosts = "".join(f"  spark-{i}: {{address: 192.168.1.{10 + i}, role: {'head' if i == 1 else 'worker'}}}\n"
                    for i in range(1, n + 1))
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "inv.yml").write_text(f"name: t\nvars: {{user: spark}}\nhosts:\n{hosts}")
        return load_inventory(Path(d) / "inv.yml")


def test_a_draft_model_in_speculative_config_is_staged_and_ngram_needs_none():
    from sparkcluster.recipes.load import draft_models
    assert draft_models(["--speculative-config", '{"method": "dflash", "model": "z-lab/Drafter-DFlash"}']) == \
        ["z-lab/Drafter-DFlash"]
    assert draft_models(['--speculative-config={"model": "org/eagle3"}']) == ["org/eagle3"]
    assert draft_models(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']) == []
    assert draft_models(["--max-model-len", "512"]) == []
    with pytest.raises(UsageError, match="is not JSON"):
        draft_models(["--speculative-config", "{method: mtp}"])


def test_a_missing_image_names_eugrs_build_command_with_the_recipes_build_args(tmp_path):
    from sparkcluster.recipes.load import build_fix
    path = tmp_path / "r.yaml"
    path.write_text('recipe_version: "1"\nname: x\ncontainer: vllm-node-mxfp4\nbuild_args: [--exp-mxfp4]\n'
                    'command: vllm serve a/b\n')
    recipe = load_recipe(str(path))
    assert recipe.container == "vllm-node-mxfp4" and recipe.build_args == ("--exp-mxfp4",)
    fix = build_fix(recipe, recipe.container)
    assert "`./build-and-copy.sh -t vllm-node-mxfp4 --exp-mxfp4`" in fix
    assert "`sparkcluster image sync vllm-node-mxfp4`" in fix


def test_a_name_twice_below_a_registry_is_ambiguous(tmp_path):
    from sparkcluster.recipes import registry as recipe_registry
    repo = registry_repo(tmp_path)
    (repo / "my-recipes" / "other").mkdir()
    (repo / "my-recipes" / "other" / "modded.yaml").write_text("model: a/other\n")
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "twice", cwd=repo)
    recipe_registry.add("mine", str(repo), True)
    with pytest.raises(UsageError, match="@mine/modded is ambiguous: @mine/other/modded, @mine/sub/modded"):
        load_recipe("@mine/modded")


def test_mods_run_in_vllms_start_directory_and_the_first_failure_stops_them(tmp_path):
    """The line every node runs, executed by a real shell here: WORKSPACE_DIR is where it starts (where vLLM will
    start), each mod runs from its own directory, and a failing one stops the rest with its exit code."""
    from sparkcluster.recipes.mods import resolve_mod, run_mods_line
    mods = tmp_path / "mods"
    for name, body in (("drop", 'cp t.jinja "$WORKSPACE_DIR/chat.jinja"\n'), ("fail", "echo broken >&2; exit 4\n"),
                       ("never", 'touch "$WORKSPACE_DIR/never-ran"\n')):
        (mods / name).mkdir(parents=True)
        (mods / name / "run.sh").write_text("#!/bin/sh\n" + body)
    (mods / "drop" / "t.jinja").write_text("{{ messages }}")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    found = [resolve_mod(f"mods/{n}", "r.yaml:3", [ModPlace(tmp_path)]) for n in ("drop", "fail", "never")]
    ok = subprocess.run(["sh", "-c", run_mods_line(found[:1], str(mods))], cwd=workspace, capture_output=True, text=True)
    assert ok.returncode == 0 and (workspace / "chat.jinja").read_text() == "{{ messages }}"
    bad = subprocess.run(["sh", "-c", run_mods_line(found, str(mods))], cwd=workspace, capture_output=True, text=True)
    assert bad.returncode == 4 and "broken" in bad.stderr and "mod fail failed (exit 4)" in bad.stderr
    assert not (workspace / "never-ran").exists()


@settings(max_examples=150, suppress_health_check=list(HealthCheck), deadline=None)
@given(doc=st.dictionaries(
    st.sampled_from(["recipe_version", "name", "container", "command", "defaults", "env", "mods", "model", "runtime",
                     "min_nodes", "max_nodes", "include", "overrides", "solo_only", "build_args", "executor"]),
    st.recursive(st.none() | st.booleans() | st.integers(-2, 4) | st.text(max_size=8)
                 | st.sampled_from(["1", "2", "vllm serve a/b -tp {tensor_parallel}", "vllm serve {model}", "{"]),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                 max_leaves=8), max_size=7))
def test_random_community_recipes_load_or_explain(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("fuzz") / "r.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        recipe = load_recipe(str(path))
    except UsageError as e:
        assert e.message and e.fix
    else:
        assert all(isinstance(v, str) for v in recipe.env.values())


@pytest.mark.parametrize("extra, recipe_text, nodes, message", [
    # mods need a running container beside Ray with the docker runtime
    (["--runtime", "docker", "--launcher", "native"], EUGR_V1, 2, "brings mods, which the docker runtime runs only"),
    # a cluster_only recipe on one node
    ([], 'recipe_version: "1"\nname: big\ncontainer: c\ncluster_only: true\ncommand: vllm serve a/b\n', 1,
     "needs at least 2 nodes (cluster_only"),
    # the recipe's TP 2 on three nodes
    ([], EUGR_V1, 3, "TP 2 x PP 1 on 3 nodes"),
])
def test_serve_refuses_what_the_nodes_cannot_run_before_connecting(tmp_path, monkeypatch, capsys, no_connection,
                                                                  extra, recipe_text, nodes, message):
    path = eugr_tree(tmp_path / "checkout", recipe=recipe_text)
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    code = cli.main(["serve", "-i", str(two_node_inventory(tmp_path, nodes)), "--recipe", str(path), "--check",
                     *extra])
    err = " ".join(capsys.readouterr().err.split())
    assert code == EXIT_USAGE and message in err, err


def test_the_communitys_registry_names_are_reserved_for_their_urls(tmp_path):
    from sparkcluster.recipes import registry as recipe_registry
    with pytest.raises(UsageError, match="'eugr-mirror' is reserved"):
        recipe_registry.add("eugr-mirror", str(registry_repo(tmp_path)), True)
    with pytest.raises(UsageError, match="'official' is reserved"):
        recipe_registry.add("official", "https://github.com/someone/recipe-registry", False)
