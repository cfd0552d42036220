"""Round 5's L1 and M7 as data: a hard link in a user's own mod folder to a file outside it is refused (it was
copied to every node); a mod of a registry that does not exist says so, with did-you-mean."""

from __future__ import annotations

import os
from pathlib import Path

from sparkcluster.recipes.load import load_recipe

from tests.support.recipes import private_home  # noqa: F401 (private_home: autouse fixture)
from tests.support.recipes import refused, registry


def own_mod(tmp_path: Path) -> Path:
    mod = tmp_path / "myrec" / "mods" / "modes"
    mod.mkdir(parents=True)
    (mod / "run.sh").write_text("#!/bin/sh\ntrue\n")
    (tmp_path / "myrec" / "rec.yaml").write_text("recipe_version: '2'\nmodel: a/b\nmods: [mods/modes]\n")
    return mod


def test_a_hard_link_to_a_file_outside_the_users_own_mod_is_refused(tmp_path):
    mod = own_mod(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's secret")
    secret.chmod(0o600)
    os.link(secret, mod / "hardlink")
    error = refused(str(tmp_path / "myrec" / "rec.yaml"))  # failed before: copied to every node
    assert "hardlink is a hard link: the file has 2 names, 1 of them outside the mod" in error.message
    assert "copy the file into the mod" in error.fix


def test_hard_links_that_all_lie_inside_the_mod_are_its_own_files(tmp_path):
    mod = own_mod(tmp_path)
    os.link(mod / "run.sh", mod / "again.sh")
    assert [m.name for m in load_recipe(str(tmp_path / "myrec" / "rec.yaml")).mods] == ["modes"]


def test_a_mod_of_a_registry_that_does_not_exist_says_so_with_did_you_mean(tmp_path):
    registry(tmp_path, "goodreg", {"recipes/x.yaml": "model: a/b\n", "mods/fix-a/run.sh": "true\n"}, trusted=True)
    mine = tmp_path / "mine.yaml"
    mine.write_text("recipe_version: '2'\nmodel: a/b\nmods: ['@GOODREG/fix-a']\n")
    error = refused(str(mine))  # failed before: "is not found (looked in (nowhere: the recipe has no folder))"
    assert error.message == (f"{mine}:3: mod '@GOODREG/fix-a' names the registry 'GOODREG', which does not exist "
                             "(did you mean 'goodreg'? registry names are case-sensitive)")
    mine.write_text("recipe_version: '2'\nmodel: a/b\nmods: ['@goodreg/fix-a']\n")
    assert load_recipe(str(mine)).mods[0].registry == "goodreg"
