"""Round 5's S2 and the community's newest recipes, as data: one rule for every registry name, typed or declared
by a repository's manifest (reserved names need the community's own URL; a declared name never shadows a
configured registry, ours or sparkrun's, and a warning names the manifest's line); and the three renders where
sparkcluster differed from sparkrun 0.4.2 (plain JSON braces in a v2 command, `model_revision`, a backslash
followed by blanks). Local git repositories stand in for the registries; nothing connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.engine.errors import EXIT_OK, UsageError
from sparkcluster.engine.modelref import ModelRef
from sparkcluster.recipes import registry
from sparkcluster.recipes.load import load_recipe
from sparkcluster.serving.phases import ServeOptions, hub_model

from tests.support.recipes import git, private_home, show  # noqa: F401 (fixtures)
from tests.support.recipes import repo

SHA = "0123456789abcdef0123456789abcdef01234567"
V2 = "recipe_version: '2'\nmodel: a/b\n"


def recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def warnings(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


# ---- renders -------------------------------------------------------------------------------------------------
JSON_BRACES = [
    # (the flag's value as the v2 command writes it, what vLLM is given, as sparkrun renders it)
    ("""'{"reasoning_parser": "deepseek_v4", "reasoning_start_str": ""}'""",
     '{"reasoning_parser": "deepseek_v4", "reasoning_start_str": ""}'),
    ("""'{"a": {"b": 1}}'""", '{"a": {"b": 1}}'),  # nested: the `}}` closes two objects, it is no escape
    ("""'{"method": "mtp", "num_speculative_tokens": {n}}'""", '{"method": "mtp", "num_speculative_tokens": 2}'),
    ("""'{}'""", "{}"),
    # a v1 command pasted into a v2 recipe: its doubled braces are escapes there, as sparkrun reads them
    ("""'{{"method": "mtp", "num_speculative_tokens": {n}}}'""", '{"method": "mtp", "num_speculative_tokens": 2}'),
]


@pytest.mark.parametrize(("written", "given"), JSON_BRACES)
def test_plain_json_braces_in_a_v2_command_are_rendered_as_written(tmp_path, written, given):
    # Failed before: the first was refused ("the command template has the placeholder {"reasoning_parser"}, not a
    # plain name"), as were the nested and empty ones.
    loaded = load_recipe(str(recipe(tmp_path, V2 + "defaults: {n: 2}\n"
                                    f"command: |\n  vllm serve {{model}} --reasoning-config {written} --port 8001\n")))
    assert loaded.flags["--reasoning-config"] == given and loaded.port == 8001


@pytest.mark.parametrize(("command", "says"), [
    ("vllm serve {model} --max-model-len {max_len}", "the command needs a value for {max_len}"),
    ("vllm serve {model} --max-model-len {max-len}", "has the placeholder {max-len}, not a plain name"),
])
def test_a_v2_placeholder_that_cannot_be_filled_is_still_refused_at_its_line(tmp_path, command, says):
    path = recipe(tmp_path, V2 + f"command: {command}\n")
    with pytest.raises(UsageError) as e:
        load_recipe(str(path))
    assert e.value.message.startswith(f"{path}:3: ") and says in e.value.message


@pytest.mark.usefixtures("no_connection")
def test_model_revision_is_served_as_the_plain_id_given_to_vllm_as_revision_and_staged_at_it(tmp_path, monkeypatch,
                                                                                              capsys):
    # Failed before: the model was `org/pinned@<sha>` in `vllm serve` (no model vLLM can resolve), with no --revision.
    path = recipe(tmp_path, f"recipe_version: '2'\nmodel: org/pinned\nmodel_revision: {SHA}\n"
                            "command: vllm serve {model} --max-model-len 4096\n")
    loaded = load_recipe(str(path))
    assert loaded.model == "org/pinned" and loaded.flags == {"--max-model-len": "4096", "--revision": SHA}
    code, doc, _ = show(monkeypatch, capsys, str(path))
    assert code == EXIT_OK and doc is not None and doc["model"] == "org/pinned"
    assert doc["commands"][0].startswith("vllm serve org/pinned --tensor-parallel-size 1 ")
    assert doc["commands"][0].endswith(f"--max-model-len 4096 --revision {SHA}")
    # serve stages the revision vLLM loads
    assert hub_model(ServeOptions(recipe=loaded).serve_args()) == ModelRef("org/pinned", SHA)
    given = ServeOptions(recipe=loaded, extra=("--revision", "v2"))  # the user's own --revision wins
    assert hub_model(given.serve_args()) == ModelRef("org/pinned", "v2")
    # a command-less recipe too; a --revision the command writes itself stays as written
    built = load_recipe(str(recipe(tmp_path, f"recipe_version: '2'\nmodel: org/pinned\nmodel_revision: {SHA}\n")))
    assert built.model == "org/pinned" and built.flags["--revision"] == SHA
    own = load_recipe(str(recipe(tmp_path, f"recipe_version: '2'\nmodel: org/pinned\nmodel_revision: {SHA}\n"
                                           "command: vllm serve {model} --revision=v1\n")))
    assert own.flags == {"--revision": "v1"}


def test_a_model_revision_that_would_name_a_path_outside_refs_is_refused_at_its_line(tmp_path):
    path = recipe(tmp_path, "recipe_version: '2'\nmodel: org/pinned\nmodel_revision: ../../x\n")
    with pytest.raises(UsageError) as e:
        load_recipe(str(path))
    assert e.value.message.startswith(f"{path}:3: model_revision '../../x' is not a revision")


@pytest.mark.parametrize("blanks", [" ", "   ", "\t", " \t "])
@pytest.mark.parametrize("version", ["recipe_version: '2'\nmodel: a/b\n",
                                     'recipe_version: "1"\nname: x\ncontainer: c\n'])
def test_a_backslash_followed_by_blanks_continues_the_line(tmp_path, blanks, version):
    # Failed before: "' ' follows no flag" (bash's escaped blank, a stray argument), refused at the command's line.
    command = f"vllm serve a/b \\{blanks}\n  --max-model-len 4096 \\{blanks}\n  --enforce-eager\n"
    loaded = load_recipe(str(recipe(tmp_path, version + "command: |\n" + "".join(f"  {line}\n" for line in
                                                                                  command.splitlines()))))
    assert loaded.model == "a/b" and loaded.flags == {"--max-model-len": "4096", "--enforce-eager": None}


# ---- S2: one rule for registry names -------------------------------------------------------------------------
def sparkrun_eugr(tmp_path: Path) -> Path:
    """sparkrun's `eugr` clone, trusted in sparkrun's own config, with the mod `fix-eugr`."""
    clone = registry.sparkrun_clones_dir() / "eugr"
    for rel, text in {"recipes/qwen-real.yaml": "recipe_version: '2'\nmodel: eugr/real\n",
                      "mods/fix-eugr/run.sh": "#!/bin/sh\ntrue\n"}.items():
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        (clone / rel).write_text(text)
    config = tmp_path / "config" / "sparkrun"
    config.mkdir(parents=True)
    (config / "registries.yaml").write_text("registries:\n  - {name: eugr, trusted: true}\n")
    return clone


def test_a_manifest_cannot_take_a_reserved_name_and_shadow_sparkruns_trusted_eugr(tmp_path, monkeypatch, capsys):
    """The report's S2: evil declares `eugr` and `official`; @eugr/..., and the eugr mods fallback of a trusted
    registry's recipe, must stay sparkrun's clone."""
    eugr = sparkrun_eugr(tmp_path)
    good = repo(tmp_path / "good-src", {"recipes/usesfix.yaml": V2 + "mods: [fix-eugr]\n"})
    evil = repo(tmp_path / "evil-src", {
        ".sparkrun/registry.yaml": "registries:\n  - {name: evil, recipes: recipes, mods: mods}\n"
                                   "  - {name: eugr, recipes: recipes, mods: mods}\n"
                                   "  - {name: official, recipes: recipes, mods: mods}\n",
        "recipes/qwen-real.yaml": "recipe_version: '2'\nmodel: evil/payload\n",
        "mods/fix-eugr/run.sh": "#!/bin/sh\ntouch /tmp/pwned\n"})
    registry.add("good", str(good), True)
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    assert cli.main(["recipes", "add-registry", "evil", str(evil)]) == EXIT_OK
    said = warnings(capsys)  # told as it is added (failed before: not a word)
    manifest = registry.clones_dir() / "evil" / ".sparkrun" / "registry.yaml"
    for name, line in (("eugr", 3), ("official", 4)):
        assert f"{manifest}:{line}: registry 'evil' declares '{name}', a name reserved for the community's own" in said
    real = load_recipe("@eugr/qwen-real")
    # Failed before: evil/payload, "registry eugr (untrusted)", from evil's clone
    assert (real.model, real.registry, real.trusted) == ("eugr/real", "eugr", True)
    assert set(registry.registries()) == {"good", "evil", "eugr"}  # no `official` from evil
    # Failed before: "brings mods from the registry 'evil', which is not trusted (fix-eugr)"
    uses = load_recipe("@good/usesfix")
    assert uses.mods[0].path == eugr / "mods" / "fix-eugr" and uses.mods[0].trusted
    assert "declares 'eugr'" not in warnings(capsys)  # once a command, though the registries are read at every lookup


def test_a_declared_name_never_shadows_sparkruns_registry_of_that_name(tmp_path, capsys):
    theirs = registry.sparkrun_clones_dir() / "lab" / "recipes"
    theirs.mkdir(parents=True)
    (theirs / "one.yaml").write_text("recipe_version: '2'\nmodel: sparkrun/lab\n")
    other = repo(tmp_path / "other", {
        ".sparkrun/registry.yaml": "registries:\n  - {name: other, recipes: recipes}\n  - {name: lab, recipes: lab}\n",
        "lab/one.yaml": "recipe_version: '2'\nmodel: other/lab\n", "recipes/x.yaml": V2})
    registry.add("other", str(other), False)
    # Failed before: other/lab, the declared sibling taking the name before sparkrun's clones were read
    assert load_recipe("@lab/one").model == "sparkrun/lab" and registry.registries()["lab"].origin == "sparkrun"
    said = warnings(capsys)
    assert (f"{registry.clones_dir() / 'other' / '.sparkrun' / 'registry.yaml'}:3: registry 'other' declares 'lab', "
            "which is already sparkrun's registry") in said and "@lab/... stays that one" in said


def test_the_first_registry_of_a_repository_added_under_another_name_is_listed_once(tmp_path):
    both = repo(tmp_path / "arena", {
        ".sparkrun/registry.yaml": "registries:\n  - {name: stable, recipes: stable-recipes}\n"
                                   "  - {name: trial, recipes: trial-recipes}\n",
        "stable-recipes/stable-one.yaml": "recipe_version: '2'\nmodel: org/stable\n",
        "trial-recipes/trial-one.yaml": "recipe_version: '2'\nmodel: org/trial\n"})
    registry.add("mine", str(both), False)
    # Failed before: `stable` was exposed beside `mine`, which is it: every stable recipe in two registries
    assert load_recipe("stable-one").registry == "mine"
    assert [ref for _, ref, _ in registry.listing()] == ["@mine/stable-one", "@trial/trial-one"]


def github_stand_ins(tmp_path: Path, monkeypatch, repos: dict[str, Path]) -> dict[str, str]:
    """git reaches each repository by the community's GitHub URL (as the conformance tool does), so that the
    reserved names they declare are theirs to declare."""
    urls = {name: f"https://github.com/spark-arena/{name}" for name in repos}
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text("".join(f'[url "{path}"]\n\tinsteadOf = {urls[name]}\n' for name, path in repos.items()))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    return urls


def test_a_later_repositorys_declared_name_does_not_replace_an_earlier_ones(tmp_path, monkeypatch, capsys):
    arena = repo(tmp_path / "recipe-registry", {
        ".sparkrun/registry.yaml": "registries:\n  - {name: official, recipes: official-recipes}\n"
                                   "  - {name: experimental, recipes: experimental-recipes}\n",
        "official-recipes/o.yaml": V2, "experimental-recipes/e.yaml": "recipe_version: '2'\nmodel: arena/exp\n"})
    later = repo(tmp_path / "community-recipe-registry", {
        ".sparkrun/registry.yaml": "registries:\n  - {name: community, recipes: recipes}\n"
                                   "  - {name: experimental, recipes: exp}\n",
        "recipes/c.yaml": V2, "exp/e.yaml": "recipe_version: '2'\nmodel: community/exp\n"})
    urls = github_stand_ins(tmp_path, monkeypatch, {"recipe-registry": arena, "community-recipe-registry": later})
    registry.add("official", urls["recipe-registry"], True)
    registry.add("community", urls["community-recipe-registry"], False)
    # Failed before: the config was written sorted, `community` read first, and its `experimental` taken
    exp = load_recipe("@experimental/e")
    assert (exp.model, exp.trusted) == ("arena/exp", True)
    assert registry.registries()["experimental"].origin == "declared by official"
    said = warnings(capsys)
    assert "registry 'community' declares 'experimental', which is already the registry declared by official" in said
    # the same repository's names, each added by its own name (as the conformance tool adds them): official's
    # manifest declaring the `experimental` of its own URL is no shadow, and no word
    registry.add("experimental", urls["recipe-registry"], True)
    assert load_recipe("@experimental/e").model == "arena/exp"
    assert "registry 'official' declares" not in warnings(capsys)


def test_the_config_keeps_the_registries_in_the_order_they_were_added(tmp_path):
    # Failed before: written sorted, so that a later registry's declared names came first
    for name in ("zeta", "alpha"):
        registry.add(name, str(repo(tmp_path / name, {"recipes/x.yaml": V2})), False)
    assert list(registry.registries()) == ["zeta", "alpha"]
