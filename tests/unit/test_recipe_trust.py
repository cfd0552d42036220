"""Community recipes that would run someone else's code, or smuggle words into a shell or docker line: each
written here as data (recipe and registry files, local git repositories), refused or made inert before anything
connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.engine.errors import UsageError
from sparkcluster.serving import recipe_registry
from sparkcluster.serving.recipes import load_recipe

from .test_recipe_formats import git, private_home, registry_repo  # noqa: F401 (private_home: autouse fixture)


def untrusted_registry(tmp_path: Path) -> None:
    """`untr`, not trusted: a base recipe whose mods are its own (relative) and one naming @untr/ explicitly."""
    repo = registry_repo(tmp_path)
    (repo / "my-recipes" / "base.yaml").write_text("recipe_version: '2'\nmodel: a/base\nmods: [mods/drop-template]\n")
    (repo / "my-recipes" / "scoped-base.yaml").write_text(
        "recipe_version: '2'\nmodel: a/base\nmods: ['@untr/drop-template']\n")
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "bases", cwd=repo)
    recipe_registry.add("untr", str(repo), False)


@pytest.mark.parametrize("top", [
    "recipe_version: '2'\ninclude: '@untr/base'\nmodel: me/mine\n",  # the base's own mods, merged in
    "recipe_version: '2'\ninclude: '@untr/scoped-base'\nmodel: me/mine\n",
    "recipe_version: '2'\nmodel: me/mine\nmods: ['@untr/drop-template']\n",  # named by a local file
])
def test_an_untrusted_registrys_mod_is_refused_whichever_recipe_brings_it(tmp_path, top):
    untrusted_registry(tmp_path)
    local = tmp_path / "mine.yaml"
    local.write_text(top)
    with pytest.raises(UsageError) as e:
        load_recipe(str(local))
    assert e.value.exit_code == 2
    assert "registry 'untr', which is not trusted" in e.value.message
    assert "recipes add-registry untr URL --trust" in e.value.fix and "--trust" in e.value.fix
    mod = load_recipe(str(local), trust=True).mods[0]
    assert (mod.name, mod.registry, mod.trusted) == ("drop-template", "untr", False)


def test_a_trusted_registrys_recipe_cannot_pull_an_untrusted_base_with_mods(tmp_path):
    untrusted_registry(tmp_path)
    good = tmp_path / "good"
    (good / "recipes").mkdir(parents=True)
    (good / "recipes" / "top.yaml").write_text("recipe_version: '2'\ninclude: '@untr/base'\nmodel: me/top\n")
    git("init", "-q", "-b", "main", cwd=good)
    git("add", ".", cwd=good)
    git("commit", "-q", "-m", "top", cwd=good)
    recipe_registry.add("good", str(good), True)
    with pytest.raises(UsageError, match="registry 'untr', which is not trusted"):
        load_recipe("@good/top")
    recipe_registry.add("untr", str(tmp_path / "repo"), True)
    assert load_recipe("@good/top").mods[0].trusted
