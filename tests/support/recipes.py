"""Registries and homes for the recipes' tests: a private home (autouse where imported), no connection, a registry made
as a git clone, a two-node inventory, and `recipes show` run as a user runs it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.engine.errors import EXIT_OK, EXIT_USAGE, UsageError
from sparkcluster.recipes import registry as recipe_registry
from sparkcluster.recipes.load import load_recipe


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    """Registries live under the user's config and cache: a fresh pair per test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def show(monkeypatch, capsys, *argv: str) -> tuple[int, dict | None, str]:
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    code = cli.main(["recipes", "show", "--json", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == EXIT_OK else None, " ".join(err.split())


# ---- registries: a local git repository made in the test -----------------------------------------------
def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(cwd), "PATH": "/usr/bin:/bin"})


def registry_repo(root: Path) -> Path:
    repo = root / "repo"
    (repo / ".sparkrun").mkdir(parents=True)
    (repo / ".sparkrun" / "registry.yaml").write_text(
        "registries:\n  - {name: mine, recipes: my-recipes, mods: my-mods}\n")
    (repo / "my-recipes" / "sub").mkdir(parents=True)
    (repo / "my-mods" / "drop-template").mkdir(parents=True)
    (repo / "my-mods" / "drop-template" / "run.sh").write_text("#!/bin/sh\ntrue\n")
    (repo / "my-recipes" / "plain.yaml").write_text("recipe_version: '2'\nmodel: a/plain\n")
    (repo / "my-recipes" / "sub" / "modded.yaml").write_text("recipe_version: '2'\nmodel: a/modded\n"
                                                             "mods: [mods/drop-template]\n")
    (repo / "my-recipes" / "sub" / "plain.yaml").write_text("recipe_version: '2'\nmodel: a/deeper\n")
    (repo / "my-recipes" / "sub" / "twice.yaml").write_text("model: a/b\n")
    (repo / "my-recipes" / "twice.yml").write_text("model: a/c\n")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "recipes", cwd=repo)
    return repo


def two_node_inventory(tmp_path: Path, count: int = 2) -> Path:
    inv = tmp_path / "inv.yml"
    hosts = "".join(f"  spark-{i}: {{address: 10.0.0.{i}, role: {'head' if i == 1 else 'worker'}}}\n"
                    for i in range(1, count + 1))
    inv.write_text(f"name: t\nvars: {{user: spark}}\nhosts:\n{hosts}")
    return inv


def registry(tmp_path: Path, name: str, files: dict[str, str], trusted: bool = False) -> None:
    """A local git repository of recipes (recipes/NAME.yaml), added as the registry `name`."""
    repo = tmp_path / f"repo-{name}"
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "recipes", cwd=repo)
    recipe_registry.add(name, str(repo), trusted)


def refused(ref: str) -> UsageError:
    with pytest.raises(UsageError) as e:
        load_recipe(ref)
    assert e.value.exit_code == EXIT_USAGE
    return e.value


def repo(root: Path, files: dict[str, str]) -> Path:
    """A git repository holding `files` (path -> text)."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git("init", "-q", "-b", "main", cwd=root)
    git("add", ".", cwd=root)
    git("commit", "-q", "-m", "files", cwd=root)
    return root
