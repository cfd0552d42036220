"""Trust is a property of where a file really is: round 4's trust reproductions as data. A trusted registry
`good`, an untrusted `evil` whose mod `pwn` would touch a canary file, and sparkrun's `eugr` clone (trusted in
sparkrun's own config); every route by which evil's code passed for good's or eugr's (`..` in `@REG/rel`, in an
include, in a typed `--recipe`, through eugr's fallback; a mod's symlink; a file in evil's clone; a file in the
working directory; a manifest pointing out of its clone) is refused with exit 2 before anything connects, naming
the registry. The resolver itself is held to its promise by hypothesis over random names."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkcluster import cli
from sparkcluster.engine.errors import EXIT_OK, EXIT_USAGE, UsageError
from sparkcluster.recipes import registry as recipe_registry
from sparkcluster.recipes.load import load_recipe
from sparkcluster.recipes.mods import mod_files
from sparkcluster.recipes.paths import Clone, Outside, lookup, owner

from tests.support.recipes import git, private_home, registry_repo  # noqa: F401 (fixtures)
from tests.support.recipes import repo

CANARY = "#!/bin/sh\ntouch /tmp/pwned-by-mod\n"
V2 = "recipe_version: '2'\nmodel: a/b\n"


@dataclass
class World:
    tmp: Path
    good: Path  # the clones, where sparkcluster keeps them
    evil: Path
    eugr: Path
    secret: Path
    inventory: Path


@pytest.fixture
def world(tmp_path) -> World:
    secret = tmp_path / "control-secret.txt"
    secret.write_text("the control machine's secret")
    secret.chmod(0o600)
    good_src = repo(tmp_path / "good-src", {
        "recipes/goodm.yaml": V2 + "mods: [fix-a]\n",
        "recipes/looted.yaml": V2 + "mods: [loot-mod]\n",
        "mods/fix-a/run.sh": "#!/bin/sh\ntrue\n",
        "mods/loot-mod/run.sh": "#!/bin/sh\ntrue\n"})
    os.symlink(secret, good_src / "mods" / "loot-mod" / "loot")
    git("add", ".", cwd=good_src)
    git("commit", "-q", "-m", "loot", cwd=good_src)
    evil_src = repo(tmp_path / "evil-src", {
        "mods/pwn/run.sh": CANARY,
        "recipes/direct.yaml": V2 + "mods: [pwn]\n",
        "recipes/base.yaml": V2 + "mods: [pwn]\n",
        "recipes/viaat.yaml": V2 + "mods: ['@good/../../evil/mods/pwn']\n",
        "recipes/viainclude.yaml": "recipe_version: '2'\ninclude: '@good/../../evil/recipes/base'\nmodel: a/c\n",
        "recipes/viaeugr.yaml": V2 + "mods: ['fix-a/../../../../../sparkcluster/registries/evil/mods/pwn']\n"})
    recipe_registry.add("good", str(good_src), True)
    recipe_registry.add("evil", str(evil_src), False)
    # sparkrun's eugr clone, trusted in sparkrun's own config: its mods are the fallback of every recipe
    eugr = tmp_path / "cache" / "sparkrun" / "registries" / "eugr"
    (eugr / "mods" / "fix-a").mkdir(parents=True)
    (eugr / "mods" / "fix-a" / "run.sh").write_text("#!/bin/sh\ntrue\n")
    (eugr / "recipes").mkdir()
    (tmp_path / "config" / "sparkrun").mkdir(parents=True)
    (tmp_path / "config" / "sparkrun" / "registries.yaml").write_text("registries:\n  - {name: eugr, trusted: true}\n")
    inventory = tmp_path / "inv.yml"
    inventory.write_text("name: t\nvars: {user: spark}\nhosts:\n  spark-1: {address: 10.0.0.1, role: head}\n"
                         "  spark-2: {address: 10.0.0.2, role: worker}\n")
    clones = recipe_registry.clones_dir()
    return World(tmp_path, clones / "good", clones / "evil", eugr, secret, inventory)


def refusal(ref: str, trust: bool = False) -> str:
    with pytest.raises(UsageError) as e:
        load_recipe(ref, trust=trust)
    assert e.value.exit_code == EXIT_USAGE
    return " ".join(f"{e.value.message} (fix: {e.value.fix})".split())


def test_a_mod_named_through_a_trusted_registry_into_an_untrusted_one_is_refused(world):
    """S1: `@good/../../evil/mods/pwn` was joined onto good's mods folder and kept good's trust."""
    said = refusal("@evil/viaat", trust=True)  # even with --trust: the name itself is refused, not its trust
    assert "mod '@good/../../evil/mods/pwn' leads out of the registry 'good''s mods folder" in said, said
    assert str(world.evil / "mods" / "pwn") in said


def test_an_include_or_a_typed_name_through_a_trusted_registry_is_refused(world):
    """S2: `include: "@good/../../evil/recipes/base"`, and the same typed as `--recipe`."""
    said = refusal("@evil/viainclude", trust=True)
    assert "@good/../../evil/recipes/base leads out of the registry 'good''s recipes folder" in said, said
    said = refusal("@good/../../evil/recipes/direct")
    assert "@good/../../evil/recipes/direct leads out of the registry 'good''s recipes folder" in said, said


def test_an_include_beside_the_file_stays_inside_its_tree(world):
    """An include without @ is looked up beside the file and must stay inside its repository (here good's clone)."""
    (world.good / "recipes" / "viarel.yaml").write_text("recipe_version: '2'\ninclude: ../../evil/recipes/base\n")
    said = refusal("@good/viarel", trust=True)
    assert "viarel.yaml:2: include '../../evil/recipes/base' leads out of the recipe's folder" in said, said
    (world.good / "recipes" / "common").mkdir()
    (world.good / "recipes" / "common" / "base.yaml").write_text(V2 + "mods: [fix-a]\n")
    (world.good / "recipes" / "inside.yaml").write_text("recipe_version: '2'\ninclude: common/base\n")
    mod = load_recipe("@good/inside").mods[0]
    assert (mod.name, mod.registry, mod.trusted) == ("fix-a", "good", True)


def test_a_mod_holding_a_fifo_or_a_dangling_link_is_refused_not_read(world):
    fix = world.good / "mods" / "fix-a"
    os.mkfifo(fix / "pipe")  # reading it would hang the serve
    assert "fix-a" in refusal("@good/goodm") and "pipe is not a regular file" in refusal("@good/goodm")
    (fix / "pipe").unlink()
    os.symlink(fix / "gone", fix / "dangling")
    assert "dangling is a symlink to nothing" in refusal("@good/goodm")


def test_eugrs_fallback_cannot_walk_back_into_an_untrusted_clone(world):
    """S3: `fix-a/..` where only eugr's mods hold fix-a: the name left eugr's folder and kept eugr's trust."""
    said = refusal("@evil/viaeugr", trust=True)
    assert "leads out of the registry 'eugr''s mods folder" in said, said


def test_a_mods_symlink_out_of_the_mod_is_refused_and_its_files_keep_their_modes(world):
    """S6: `mods/loot-mod/loot -> a 0600 file of the control machine` was copied to every node, 0644."""
    said = refusal("@good/looted")
    assert "mod 'loot-mod'" in said and "loot is a symlink out of the mod" in said and "registry 'good'" in said, said
    from sparkcluster.recipes.types import Mod
    with pytest.raises(UsageError, match="symlink out of the mod"):  # at copy time too, whoever made the Mod
        mod_files(Mod("loot-mod", world.good / "mods" / "loot-mod", "loot-mod", "good", True))
    # inside the mod: a link to a file of the mod is copied as a regular file; modes are the files' own
    fix = world.good / "mods" / "fix-a"
    (fix / "key.pem").write_text("mine")
    (fix / "key.pem").chmod(0o600)
    (fix / "tool").write_text("#!/bin/sh\n")
    (fix / "tool").chmod(0o777)
    os.symlink("key.pem", fix / "same-key")
    files = {rel: (content, mode) for rel, content, mode in mod_files(load_recipe("@good/goodm").mods[0])}
    assert files == {"key.pem": (b"mine", 0o600), "run.sh": (b"#!/bin/sh\ntrue\n", 0o744),
                     "same-key": (b"mine", 0o600), "tool": (b"#!/bin/sh\n", 0o755)}


def test_a_recipe_file_in_an_untrusted_clone_is_untrusted_however_it_is_reached(world):
    """S5: the path of evil's recipe file (or a link to it) passed for the user's own, trusted file."""
    for path in (world.evil / "recipes" / "direct.yaml", world.tmp / "link.yaml"):
        if path.name == "link.yaml":
            os.symlink(world.evil / "recipes" / "direct.yaml", path)
        said = refusal(str(path))
        assert "brings mods from the registry 'evil', which is not trusted" in said, said
        recipe = load_recipe(str(path), trust=True)
        assert (recipe.registry, recipe.mods[0].registry, recipe.mods[0].trusted) == ("evil", "evil", False)
    # a stray clone (a registry removed by hand, a partial clone) is nobody's trusted file either
    stray = recipe_registry.clones_dir() / "stray"
    (stray / "mods" / "pwn").mkdir(parents=True)
    (stray / "mods" / "pwn" / "run.sh").write_text(CANARY)
    (stray / "r.yaml").write_text(V2 + "mods: [pwn]\n")
    assert "registry 'stray', which is not trusted" in refusal(str(stray / "r.yaml"))


@pytest.mark.parametrize("ref", ["@evil/viaat", "@evil/viainclude", "@good/../../evil/recipes/direct",
                                 "@evil/viaeugr", "@good/looted", "EVIL_FILE"])
@pytest.mark.usefixtures("no_connection")
def test_serve_refuses_every_route_with_exit_2_before_connecting(world, monkeypatch, capsys, ref):
    ref = str(world.evil / "recipes" / "direct.yaml") if ref == "EVIL_FILE" else ref
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    code = cli.main(["serve", "-i", str(world.inventory), "--tp", "2", "--runtime", "host", "--recipe", ref])
    err = " ".join(capsys.readouterr().err.split())
    assert code == EXIT_USAGE and "registry '" in err, err


def test_a_bare_name_is_bundled_or_a_registrys_never_a_file_in_the_working_directory(world, monkeypatch, capsys):
    """S4: a plain `serve` loaded ./default.yaml (mods and all) as the user's own; ./gpt-oss-120b.yaml shadowed
    the bundled recipe."""
    checkout = world.tmp / "someone-elses-checkout"
    (checkout / "mods" / "pwn").mkdir(parents=True)
    (checkout / "mods" / "pwn" / "run.sh").write_text(CANARY)
    for name in ("default.yaml", "gpt-oss-120b.yaml", "mine.yaml"):
        (checkout / name).write_text("recipe_version: '2'\nmodel: someone/else\nmods: [pwn]\n")
    monkeypatch.chdir(checkout)
    for name in ("default", "gpt-oss-120b"):  # `serve` without --recipe loads `default`
        recipe = load_recipe(name)
        assert recipe.source == f"recipe {name}" and recipe.model != "someone/else" and not recipe.mods
    code = cli.main(["recipes", "show", "--json", "gpt-oss-120b"])
    assert code == EXIT_OK and json.loads(capsys.readouterr().out)["mods"] == []
    # a file is named as a file: with a slash, or by its .yaml name
    for name in ("./default.yaml", "gpt-oss-120b.yaml", str(checkout / "mine.yaml"), "./mine"):
        assert load_recipe(name).model == "someone/else"
    said = refusal("mine")
    assert "no recipe named 'mine'" in said and "a file in this folder is given by its path: ./mine.yaml" in said


def manifest_registry(tmp_path: Path, manifest: str) -> None:
    (tmp_path / "outside").mkdir(exist_ok=True)
    (tmp_path / "outside" / "stolen.yaml").write_text(V2)
    src = repo(tmp_path / "dos-src", {".sparkrun/registry.yaml": manifest, "recipes/own.yaml": V2})
    os.symlink(tmp_path / "outside", src / "linked")
    git("add", ".", cwd=src)
    git("commit", "-q", "-m", "link", cwd=src)
    recipe_registry.add("dos", str(src), False)


@pytest.mark.parametrize(("manifest", "line", "what"), [
    ("registries:\n  - name: dos\n    recipes: ../..\n", 3, "recipes"),
    ("registries:\n  - name: dos\n    recipes: recipes/../../../../../outside\n", 3, "recipes"),
    ("registries:\n  - name: dos\n    recipes: linked\n", 3, "recipes"),
    ("# mine\nregistries:\n  - name: dos\n    recipes: recipes\n    mods: /root/.ssh\n", 5, "mods"),
])
def test_a_manifest_folder_outside_its_clone_skips_that_registry_with_a_warning(tmp_path, capsys, manifest, line,
                                                                                 what):
    """D1: `recipes: /` made every lookup walk the whole filesystem (and die with a traceback)."""
    recipe_registry.add("mine", str(registry_repo(tmp_path)), False)
    manifest_registry(tmp_path, manifest)
    capsys.readouterr()
    listed = [ref for _, ref, _ in recipe_registry.listing()]
    assert listed and all(not ref.startswith("@dos/") for ref in listed), listed
    assert load_recipe("plain").model == "a/plain"  # unscoped names keep working
    err = " ".join(capsys.readouterr().err.split())
    where = recipe_registry.clones_dir() / "dos" / ".sparkrun" / "registry.yaml"
    assert f"warning: {where}:{line}: registry 'dos' puts its {what} folder outside its clone" in err, err
    with pytest.raises(UsageError, match=f"registry.yaml:{line}: registry 'dos' puts its {what} folder outside"):
        load_recipe("@dos/own")


@pytest.mark.parametrize(("name", "url", "why"), [
    ("eugr", "https://github.com/eugr/../attacker/recipes", "reserved"),
    ("eugr", "https://github.com/eugr/%2E%2E/attacker/recipes", "reserved"),
    ("eugr", "git@github.com:eugr/../attacker/recipes", "reserved"),
    ("official", "ssh://git@github.com/spark-arena/./../attacker/x", "reserved"),
    ("\u0435ugr", "https://github.com/eugr/recipes", "ASCII letters"),  # a Cyrillic е
    ("e\u00fcgr", "https://github.com/attacker/recipes", "ASCII letters"),
])
def test_reserved_names_are_checked_on_the_normalised_url_and_the_exact_ascii_name(tmp_path, monkeypatch, name,
                                                                                     url, why):
    """M5: git normalises `eugr/../attacker` to attacker's repository; `еugr` read as eugr."""
    monkeypatch.setenv("GIT_ALLOW_PROTOCOL", "file")  # should a check let it through: no clone off this machine
    with pytest.raises(UsageError, match=why):
        recipe_registry.add(name, url, False)
    assert not recipe_registry.config_file().exists() and not recipe_registry.clones_dir().exists()


def test_remove_registry_forgets_it_and_its_clone_and_names_what_it_cannot_remove(tmp_path, monkeypatch, capsys):
    recipe_registry.add("mine", str(registry_repo(tmp_path)), False)
    clone = recipe_registry.clones_dir() / "mine"
    assert cli.main(["recipes", "remove-registry", "mine", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"registry": "mine", "removed": True, "clone": str(clone)}
    assert not clone.exists() and "mine" not in recipe_registry.registries()
    assert "mine" not in recipe_registry.config_file().read_text()
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    # again: nothing left of it; a name never configured (a typo) is an error, not a silent success
    assert cli.main(["recipes", "remove-registry", "mine"]) == EXIT_USAGE
    assert "no registry named 'mine'" in " ".join(capsys.readouterr().err.split())
    sparkrun = tmp_path / "cache" / "sparkrun" / "registries" / "theirs"
    sparkrun.mkdir(parents=True)
    assert cli.main(["recipes", "remove-registry", "theirs"]) == EXIT_USAGE
    err = " ".join(capsys.readouterr().err.split())
    assert "registry 'theirs' is sparkrun's" in err and "sparkrun registry remove theirs" in err, err
    assert sparkrun.is_dir()


# ---- the resolver, held to its promise over random names -------------------------------------------------
SEGMENTS = ["mods", "x", "y", "..", ".", "", "to-b", "up", "abs", "loop", "run.sh", "a", "b", "nope", "to-secret"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> tuple[Path, list[Clone]]:
    """Two clones (`a` trusted, `b` not) and a secret beside them; `a`'s mods hold links into `b`, up, to an
    absolute path, to the secret and to themselves."""
    root = tmp_path_factory.mktemp("tree").resolve()
    for clone in ("a", "b"):
        for mod in ("x", "y"):
            (root / clone / "mods" / mod).mkdir(parents=True)
            (root / clone / "mods" / mod / "run.sh").write_text("true\n")
    (root / "secret").write_text("s")
    links = {"to-b": "../../b/mods", "up": "..", "abs": str(root), "loop": "loop", "to-secret": "../../../secret"}
    for name, target in links.items():
        os.symlink(target, root / "a" / "mods" / name)
        os.symlink(target, root / "a" / "mods" / "x" / name)
    return root, [Clone(root / "a", "a", True), Clone(root / "b", "b", False)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(SEGMENTS), max_size=8), start=st.sampled_from(["", "/", "A/", "B/mods/"]),
       folder=st.sampled_from(["a/mods", "a/mods/x", "b/mods", "a"]))
def test_no_name_resolves_outside_its_folder_or_with_another_folders_trust(tree, parts, start, folder):
    root, clones = tree
    start = {"A/": f"{root}/a/", "B/mods/": f"{root}/b/mods/"}.get(start, start)  # absolute parts, into a clone
    name = start + "/".join(parts)
    base = root / folder
    joined = os.path.join(base, name)
    try:
        found = lookup(base, name)
    except Outside as e:  # refused: it really is there, and really outside
        assert e.found == Path(os.path.realpath(joined)) and e.found.exists() and not e.found.is_relative_to(base)
        return
    if found is None:
        assert not os.path.exists(joined)  # nothing the system would open: missing, a dangling link, a loop
        return
    assert found == Path(os.path.realpath(joined)) and found.is_relative_to(base)
    holder = owner(found, clones)
    assert holder is not None and holder == owner(base, clones)  # the folder's own clone, its trust


def test_a_registry_declared_beside_another_is_removed_with_it_and_owns_its_own_files(tmp_path, monkeypatch, capsys):
    src = repo(tmp_path / "two", {
        ".sparkrun/registry.yaml": "registries:\n  - {name: first, recipes: a, mods: a-mods}\n"
                                   "  - {name: second, recipes: b, mods: b-mods}\n",
        "a/x.yaml": V2, "b/y.yaml": V2 + "mods: [only-b]\n", "b-mods/only-b/run.sh": "#!/bin/sh\ntrue\n"})
    recipe_registry.add("first", str(src), False)
    clone = recipe_registry.clones_dir() / "first"
    recipe = load_recipe(str(clone / "b" / "y.yaml"), trust=True)  # by file: second's, with second's mods folder
    assert (recipe.registry, recipe.mods[0].path) == ("second", clone / "b-mods" / "only-b")
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    assert cli.main(["recipes", "remove-registry", "second"]) == EXIT_USAGE
    err = " ".join(capsys.readouterr().err.split())
    assert "registry 'second' is declared by the repository of registry 'first'" in err
    assert "recipes remove-registry first" in err
    assert cli.main(["recipes", "remove-registry", "first"]) == EXIT_OK
    assert not {"first", "second"} & set(recipe_registry.registries()) and not clone.exists()


LINKS = {"inside-file": "a", "inside-dir": "sub", "parent": "..", "secret": "../secret", "root": "/",
         "self": "self", "sub-up": "sub/../a", "escape-through-sub": "sub/../../secret"}


@settings(max_examples=150, deadline=None)
@given(modes=st.lists(st.sampled_from([0o600, 0o644, 0o666, 0o700, 0o755, 0o777, 0o4755]), min_size=2, max_size=2),
       links=st.lists(st.sampled_from(sorted(LINKS)), unique=True, max_size=4), depth=st.booleans())
def test_a_mods_files_are_its_own_whatever_links_it_holds(modes, links, depth):
    """Whatever links a mod holds, mod_files reads nothing outside it (or refuses), and no mode is widened."""
    import tempfile

    from sparkcluster.recipes.types import Mod
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        (root / "secret").write_bytes(b"SECRET")
        mod = root / "mod"
        (mod / "sub").mkdir(parents=True)
        for name, mode in zip(("a", "sub/b"), modes):
            (mod / name).write_bytes(name.encode())
            (mod / name).chmod(mode)
        (mod / "run.sh").write_text("true\n")
        for name in links:
            os.symlink(LINKS[name], (mod / "sub" if depth else mod) / name)
        where = mod / "sub" if depth else mod
        targets = [Path(os.path.realpath(where / n)) for n in links]
        # refused: a link out of the mod, to nothing (or itself), or to a folder that holds it (a loop)
        escapes = any(not t.exists() or not t.is_relative_to(mod) or (t.is_dir() and where.is_relative_to(t))
                      for t in targets)
        try:
            files = mod_files(Mod("mod", mod, "mod"))
        except UsageError as e:
            assert escapes and e.exit_code == EXIT_USAGE, e.message  # refused only for a link out, dangling or a loop
            return
        assert not escapes
        assert all(content != b"SECRET" for _, content, _ in files)
        originals = {"a": modes[0], "sub/b": modes[1], "run.sh": 0o644}
        for rel, content, mode in files:
            own = originals.get(rel, originals.get(content.decode(errors="replace"), 0o777))
            assert mode & 0o022 == 0 and mode & ~0o777 == 0 and mode & ~(own | 0o700) == 0, (rel, oct(mode))
