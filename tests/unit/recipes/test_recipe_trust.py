"""Community recipes that would run someone else's code, or smuggle words into a shell or docker line: each
written here as data (recipe and registry files, local git repositories), refused or made inert before anything
connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.engine.errors import SparkclusterError, UsageError
from sparkcluster.recipes import registry as recipe_registry
from sparkcluster.recipes.load import load_recipe

from tests.support.recipes import git, private_home, registry_repo  # noqa: F401 (private_home: autouse fixture)


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


def test_a_mod_directory_name_that_is_shell_is_refused_at_its_line_and_quoted_if_it_got_through(tmp_path):
    import subprocess

    from sparkcluster.recipes.mods import run_mods_line
    from sparkcluster.recipes.types import Mod
    evil = tmp_path / "mods" / "$(touch pwned)"
    evil.mkdir(parents=True)
    (evil / "run.sh").write_text("#!/bin/sh\ntrue\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("recipe_version: '2'\nmodel: a/b\nmods:\n  - 'mods/$(touch pwned)'\n")
    with pytest.raises(UsageError, match=r"r\.yaml:4: mod '.*' is in a directory named '\$\(touch pwned\)'"):
        load_recipe(str(recipe))
    # the shell line itself keeps the name as data: run by a real shell, nothing runs, the name is echoed
    line = run_mods_line([Mod("$(touch pwned)", evil, "mods/x")], str(tmp_path / "mods"))
    ran = subprocess.run(["sh", "-c", line], cwd=tmp_path, capture_output=True, text=True)
    assert ran.returncode == 0 and "mod $(touch pwned): running" in ran.stdout
    assert not (tmp_path / "pwned").exists()


def test_two_mods_of_one_directory_name_are_refused_at_the_second(tmp_path):
    for where in ("mods/fix", "other/fix"):
        (tmp_path / where).mkdir(parents=True)
        (tmp_path / where / "run.sh").write_text("#!/bin/sh\ntrue\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("recipe_version: '2'\nmodel: a/b\nmods:\n  - mods/fix\n  - other/fix\n")
    with pytest.raises(UsageError, match=r"r\.yaml:5: mod 'other/fix' .* has the directory name 'fix' of mod "
                                         r"'mods/fix'"):
        load_recipe(str(recipe))


@pytest.mark.parametrize(("text", "line"), [
    ("recipe_version: '1'\nname: x\ncontainer: '-v/:/host'\ncommand: vllm serve a/b\n", 3),
    ("recipe_version: '2'\nmodel: a/b\ncontainer: 'vllm-node --privileged'\n", 3),
    ("recipe_version: '2'\nmodel: a/b\ncontainer: vllm-node\noverrides:\n  - when: {arch: gb10}\n"
     "    container: '--volume=/:/host'\n", 6),
])
def test_a_container_that_is_not_an_image_name_is_refused_at_its_line(tmp_path, text, line):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(UsageError) as e:
        load_recipe(str(recipe))
    assert e.value.message.startswith(f"{recipe}:{line}: container ") and "is not an image name" in e.value.message
    assert "container: REPOSITORY[:TAG]" in e.value.fix


@pytest.mark.parametrize("url", ["https://evil.example/github.com/eugr/x", "https://github.com.evil.example/eugr/x",
                                 "https://github.com/evil/eugr/x", "git@evil.example:github.com/eugr/x",
                                 "https://evil.example/?github.com/eugr/"])
def test_a_reserved_name_needs_the_communitys_github_host_and_owner_not_the_text(tmp_path, url):
    with pytest.raises(UsageError, match="'eugr' is reserved"):
        recipe_registry.add("eugr", url, True)
    assert not recipe_registry.config_file().exists()


@pytest.mark.parametrize("url", ["https://github.com/eugr/spark-vllm-docker", "git@github.com:eugr/spark-vllm-docker",
                                 "https://GitHub.com/Spark-Arena/recipes.git", "ssh://git@github.com/scitrera/x"])
def test_the_communitys_own_urls_pass_the_reserved_name_check(url):
    assert recipe_registry._community_url(url)


def test_eugrs_fallback_mods_folder_is_as_trusted_as_eugr_not_as_the_recipe(tmp_path):
    """sparkrun's `eugr` clone, not trusted; a trusted registry's recipe names a mod only eugr has."""
    eugr = tmp_path / "cache" / "sparkrun" / "registries" / "eugr"
    (eugr / "mods" / "only-in-eugr").mkdir(parents=True)
    (eugr / "mods" / "only-in-eugr" / "run.sh").write_text("#!/bin/sh\ntrue\n")
    (eugr / "recipes").mkdir()
    good = tmp_path / "good"
    (good / "recipes").mkdir(parents=True)
    (good / "recipes" / "top.yaml").write_text("recipe_version: '2'\nmodel: me/top\nmods: [mods/only-in-eugr]\n")
    git("init", "-q", "-b", "main", cwd=good)
    git("add", ".", cwd=good)
    git("commit", "-q", "-m", "top", cwd=good)
    recipe_registry.add("good", str(good), True)
    with pytest.raises(UsageError, match="registry 'eugr', which is not trusted"):
        load_recipe("@good/top")
    assert load_recipe("@good/top", trust=True).mods[0].registry == "eugr"


def test_a_registry_url_starting_with_a_dash_is_refused_before_git_reads_it_as_an_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="registry URL '--upload-pack=touch pwned' starts with '-'"):
        recipe_registry.add("mine", "--upload-pack=touch pwned", False)
    assert not (tmp_path / "pwned").exists() and not recipe_registry.clones_dir().exists()


def test_the_build_line_a_user_pastes_keeps_the_recipes_build_args_as_words(tmp_path):
    import shlex
    import subprocess

    from sparkcluster.recipes.load import build_fix
    recipe = tmp_path / "r.yaml"
    recipe.write_text("recipe_version: '1'\nname: x\ncontainer: vllm-node\ncommand: vllm serve a/b\n"
                      "build_args: ['--exp-mxfp4', '$(touch pwned)', 'a b; touch pwned2']\n")
    fix = build_fix(load_recipe(str(recipe)), "vllm-node")
    line = fix.split("`")[1]
    assert shlex.split(line) == ["./build-and-copy.sh", "-t", "vllm-node", "--exp-mxfp4", "$(touch pwned)",
                                 "a b; touch pwned2"]
    # pasted into a real shell (echo standing in for the script): the words arrive as written, nothing runs
    ran = subprocess.run(["sh", "-c", line.replace("./build-and-copy.sh", "printf '%s\\n'", 1)], cwd=tmp_path,
                         capture_output=True, text=True)
    assert ran.stdout.splitlines()[-2:] == ["$(touch pwned)", "a b; touch pwned2"]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_a_registry_of_the_wrong_shape_is_named_and_skipped_not_a_traceback(tmp_path, capsys):
    recipe_registry.add("mine", str(registry_repo(tmp_path)), False)
    broken = tmp_path / "cache" / "sparkrun" / "registries" / "broken"
    (broken / ".sparkrun").mkdir(parents=True)
    (broken / ".sparkrun" / "registry.yaml").write_text("- name: broken\n  recipes: r\n")
    # a bare name: found in the good registry, the broken one warned about
    assert load_recipe("plain").model == "a/plain"
    err = " ".join(capsys.readouterr().err.split())
    assert f"warning: {broken / '.sparkrun' / 'registry.yaml'}: registry 'broken' has a manifest that is not a " \
           "mapping" in err
    assert [ref for _, ref, _ in recipe_registry.listing()] == [ref for _, ref, _ in recipe_registry.listing("mine")]
    with pytest.raises(UsageError, match="registry 'broken' has a manifest that is not a mapping") as e:
        load_recipe("@broken/x")
    assert "registries: [{name: N, recipes: DIR, mods: DIR}]" in e.value.fix
    # our own config: an entry that is not a mapping is skipped with a warning, the rest still resolve
    config = recipe_registry.config_file()
    config.write_text(config.read_text() + "  bad: [1, 2]\n")
    assert load_recipe("@mine/plain").model == "a/plain"
    assert "registry 'bad' is [1, 2], not a mapping; skipped" in " ".join(capsys.readouterr().err.split())
    config.write_text("- mine\n")  # the whole file the wrong shape: an error naming it and the fix
    with pytest.raises(UsageError, match="not a mapping with a `registries:` mapping") as e:
        load_recipe("plain")
    assert str(config) in e.value.message and "recipes add-registry" in e.value.fix


@pytest.mark.parametrize(("extra", "owner"), [
    (["--tensor_parallel_size", "4"], "--tp"), (["--pipeline_parallel_size=2"], "--pp"),
    (["--max-model-len", "9", "--served_model_name", "x"], "--served-model-name"),
    (["--distributed_executor_backend", "mp"], "--launcher"),
])
def test_extra_flags_are_read_as_vllm_reads_them_so_underscores_cannot_pass_an_owned_flag(extra, owner):
    from sparkcluster.recipes.load import parse_flags
    with pytest.raises(UsageError, match="is set by sparkcluster") as e:
        parse_flags(extra)
    assert e.value.fix == f"use sparkcluster's {owner}"


def test_an_extra_flag_replaces_the_recipes_flag_of_either_spelling(tmp_path):
    from sparkcluster.recipes.load import merged_flags
    recipe = tmp_path / "r.yaml"
    recipe.write_text("recipe_version: '2'\nmodel: a/b\ncommand: vllm serve a/b --max_model_len 384 --enforce-eager\n")
    assert merged_flags(load_recipe(str(recipe)), ["--max-model-len", "100"]) == \
        ("--enforce-eager", "--max-model-len", "100")


def test_update_reports_every_registry_and_goes_on_past_one_that_fails(tmp_path, capsys):
    import shutil

    from sparkcluster import cli
    gone = tmp_path / "gone"
    shutil.copytree(registry_repo(tmp_path), gone)
    recipe_registry.add("a-gone", str(gone), False)  # sorted first: it fails before mine is reached
    recipe_registry.add("mine", str(tmp_path / "repo"), False)
    shutil.rmtree(gone)
    shutil.rmtree(recipe_registry.clones_dir() / "a-gone")  # no last good copy either
    (tmp_path / "repo" / "my-recipes" / "new.yaml").write_text("recipe_version: '2'\nmodel: a/new\n")
    git("add", ".", cwd=tmp_path / "repo")
    git("commit", "-q", "-m", "new", cwd=tmp_path / "repo")
    assert cli.main(["recipes", "update"]) == 1
    out, err = capsys.readouterr()
    assert "a-gone: failed: registry a-gone: cloning" in " ".join(err.split()) and "mine: updated" in out
    assert load_recipe("@mine/new").model == "a/new"


def test_a_registry_re_added_with_a_new_url_is_cloned_from_it_not_pulled_from_the_old(tmp_path, capsys):
    import shutil
    old = registry_repo(tmp_path)
    new = tmp_path / "new"
    shutil.copytree(old, new)
    (new / "my-recipes" / "plain.yaml").write_text("recipe_version: '2'\nmodel: from/new\n")
    git("add", ".", cwd=new)
    git("commit", "-q", "-m", "new", cwd=new)
    recipe_registry.add("mine", str(old), False)
    assert load_recipe("@mine/plain").model == "a/plain"
    reg, said = recipe_registry.add("mine", str(new), False)
    assert said == f"cloned afresh (it was cloned from {old})"
    assert load_recipe("@mine/plain").model == "from/new" and recipe_registry.registries()["mine"].url == str(new)
    assert recipe_registry.add("mine", str(new), False)[1] == "updated"


def test_a_ray_cluster_patched_by_mods_is_not_reused_by_a_serve_with_other_mods_or_none(tmp_path):
    from sparkcluster.recipes.mods import resolve_mod
    from sparkcluster.recipes.types import ModPlace
    from sparkcluster.serving.reuse import may_reuse, ray_fingerprint

    from tests.support.serving import COMMANDS, session
    (tmp_path / "mods" / "fix").mkdir(parents=True)
    (tmp_path / "mods" / "fix" / "run.sh").write_text("#!/bin/sh\npatch -p1 < a.diff\n")
    fix = resolve_mod("mods/fix", "r.yaml:3", [ModPlace(tmp_path)])
    bare = ray_fingerprint(session(b"X=1\n"), COMMANDS)
    patched = ray_fingerprint(session(b"X=1\n"), COMMANDS, [fix])
    assert bare != patched and patched == ray_fingerprint(session(b"X=1\n"), COMMANDS, [fix])
    (tmp_path / "mods" / "fix" / "a.diff").write_text("--- a\n+++ b\n")  # the same mod, other files
    assert ray_fingerprint(session(b"X=1\n"), COMMANDS, [fix]) != patched
    # patched earlier, none now: the recorded fingerprint differs; the same mods again: never on a patched cluster
    assert not may_reuse(patched, bare, []) and not may_reuse(patched, patched, [fix])
    assert may_reuse(bare, bare, [])


class Docker:
    """A transport answering `docker image inspect` as docker does: the head holds no such image."""

    def __init__(self, host, held: bool) -> None:
        self.host, self.held = host, held

    def run(self, command):
        from sparkcluster.engine.transport import Result
        if self.held:
            return Result(command, 0, '"sha256:ab" 10 ["sha256:l1"] null', "", 0.0)
        return Result(command, 1, "", "Error response from daemon: No such image: vllm-mxfp4:latest", 0.0)


def test_a_head_without_the_image_is_a_typed_error_that_serve_turns_into_the_recipes_build_line(tmp_path):
    from sparkcluster.engine.inventory import Host, Inventory
    from sparkcluster.engine.session import Session
    from sparkcluster.serving.image import MissingImage, check_images
    from sparkcluster.serving.phases import ServeOptions, with_build_fix
    hosts = (Host("spark-1", "10.0.0.1", role="head"), Host("spark-2", "10.0.0.2", role="worker"))
    session = Session(Inventory(path=Path("inv.yml"), name="t", hosts=hosts, vars={}),
                      transports={"spark-1": Docker(hosts[0], False), "spark-2": Docker(hosts[1], True)})
    with pytest.raises(MissingImage) as missing:
        check_images(session, "vllm-mxfp4")
    assert (missing.value.head, missing.value.image) == ("spark-1", "vllm-mxfp4")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("recipe_version: '1'\nname: x\ncontainer: vllm-mxfp4\nbuild_args: [--exp-mxfp4]\n"
                      "command: vllm serve a/b\n")
    opts = ServeOptions(image="vllm-mxfp4", recipe=load_recipe(str(recipe)))
    with pytest.raises(SparkclusterError) as told:
        with_build_fix(opts, lambda: check_images(session, "vllm-mxfp4"))
    assert not isinstance(told.value, MissingImage) and told.value.message == "the head spark-1 has no image 'vllm-mxfp4'"
    assert "`./build-and-copy.sh -t vllm-mxfp4 --exp-mxfp4`" in told.value.fix
