"""Recipe registries: git repositories of recipes, cloned under the user's cache and named `@REG/NAME` as sparkrun
names them (the registry's `.sparkrun/registry.yaml` says where its recipes and mods are; a name is a file stem,
found flat first, then anywhere below; a name found twice is an error). Registries a user configured for
sparkrun (its clones under ~/.cache/sparkrun/registries) are usable as they are.

A registry is someone else's code once its recipes bring mods: it is untrusted until added with --trust. Every
name is resolved inside the folder it is looked up in (paths.py): `@REG/../other` is refused, and a manifest whose
folders lie outside its clone skips that registry. A file is as trusted as the clone that really holds it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

from ..engine import yamlsource
from ..engine.console import err as err_console
from ..engine.errors import SparkclusterError, UsageError, did_you_mean
from . import paths
from .types import ModPlace
from .yamlfile import load_last_wins

# sparkrun's defaults for the registries it ships, where a clone's manifest does not say (subpath, mods).
KNOWN_LAYOUTS = {"eugr": ("recipes", "mods"), "official": ("official-recipes", "official-mods"),
                 "experimental": ("experimental-recipes", "experimental-mods"), "community": ("recipes", None),
                 "sparkrun-testing": ("testing/recipes", None), "sparkrun-transitional": ("transitional/recipes", None)}
GIT_TIMEOUT_S = 300
# sparkrun reserves these names for the projects' own repositories, so that nobody's registry passes for the
# community's (a mod falls back to the `eugr` registry's folder): a name starting with one needs their URL.
RESERVED_PREFIXES = ("arena", "spark-arena", "sparkarena", "sparkrun", "official", "experimental", "transitional",
                     "community", "eugr", "dbotwinick", "raphaelamorim", "scitrera")
RESERVED_OWNERS = ("spark-arena", "scitrera", "eugr", "dbotwinick", "raphaelamorim")
# The exact ASCII spelling: a Cyrillic `е` in `еugr` is another name that reads as eugr.
REGISTRY_NAME = re.compile(r"[A-Za-z0-9_-]+")
MANIFEST_FIX = ("a registry's folders are paths inside its repository: fix its .sparkrun/registry.yaml, or "
                "`sparkcluster recipes remove-registry NAME`")


def _home(var: str, default: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / default)


def config_file() -> Path:
    return _home("XDG_CONFIG_HOME", ".config") / "sparkcluster" / "registries.yaml"


def clones_dir() -> Path:
    return _home("XDG_CACHE_HOME", ".cache") / "sparkcluster" / "registries"


def sparkrun_clones_dir() -> Path:
    return _home("XDG_CACHE_HOME", ".cache") / "sparkrun" / "registries"


@dataclass(frozen=True)
class Registry:
    name: str
    url: str
    trusted: bool
    clone: Path
    # or "sparkrun": configured for sparkrun, read from its clone; or "declared by REG": another registry its
    # clone's manifest declares (shares REG's clone, URL and trust; synced, recorded and removed with REG)
    origin: str = "sparkcluster"

    def layout(self) -> tuple[Path, Path | None]:
        """(recipes folder, mods folder) inside the clone; a manifest of the wrong shape is a UsageError naming
        it (lookups across registries warn and skip such a registry)."""
        manifest = self.clone / ".sparkrun" / "registry.yaml"
        if manifest.is_file():
            fix = "the registry's .sparkrun/registry.yaml should read `registries: [{name: N, recipes: DIR, mods: DIR}]`"
            try:
                doc = load_last_wins(manifest.read_text())[0] or {}  # as safe_load reads it, with each key's line
            except (OSError, UnicodeDecodeError, yamlsource.YamlError) as e:
                raise UsageError(f"{manifest}: registry {self.name!r} has a manifest that cannot be read: {e}", fix)
            entries = doc.get("registries") if isinstance(doc, dict) else None
            if not isinstance(doc, dict) or not isinstance(entries or [], list):
                raise UsageError(f"{manifest}: registry {self.name!r} has a manifest that is not a mapping with a "
                                 "`registries:` list", fix)
            entries = [e for e in entries or [] if isinstance(e, dict)]
            entry = next((e for e in entries if e.get("name") == self.name), entries[0] if entries else None)
            if entry is not None:
                mods = entry.get("mods")
                return (self._folder(entry.get("recipes") or "", f"{manifest}:{_key_line(entry, 'recipes')}", "recipes"),
                        self._folder(mods, f"{manifest}:{_key_line(entry, 'mods')}", "mods") if mods else None)
        recipes, mods = KNOWN_LAYOUTS.get(self.name, ("recipes" if (self.clone / "recipes").is_dir() else "", "mods"))
        mods_dir = self.clone / mods if mods and (self.clone / mods).is_dir() else None
        return (self._folder(recipes, str(self.clone / recipes), "recipes"),
                self._folder(mods, str(mods_dir), "mods") if mods_dir else None)

    def _folder(self, value: object, where: str, key: str) -> Path:
        """A folder the registry names, which must lie inside its clone, links followed: `recipes: /` would
        have every lookup walk the machine, `mods: /root/.ssh` make a folder of this machine its mods."""
        folder = self.clone / str(value)
        if not paths.is_inside(folder, self.clone):
            raise UsageError(f"{where}: registry {self.name!r} puts its {key} folder outside its clone ({str(value)!r} "
                             f"is {paths.real(folder)}); the registry is skipped", MANIFEST_FIX)
        return folder


def _key_line(entry: object, key: str) -> int:
    return entry.key_line(key) if isinstance(entry, yamlsource.SourceMap) and key in entry else 1


@dataclass(frozen=True)
class Found:
    path: Path
    registry: str | None  # None: the user's own file
    trusted: bool
    mods_dirs: tuple[ModPlace, ...]  # the registry's mods folder, then eugr's (each with its own trust)


def registries() -> dict[str, Registry]:
    """Ours (from the config file, in the order they were added), then sparkrun's clones not shadowed by one of
    ours, then the registries our repositories' manifests declare besides themselves, where the name is free and
    theirs to take: a manifest never shadows a configured registry (ours or sparkrun's), and a name reserved for
    the community's own registries needs their URL, as a typed name does (a warning names the manifest's line)."""
    found: dict[str, Registry] = {}
    path = config_file()
    if path.is_file():
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise UsageError(f"{path}: not valid YAML: {e}", "fix or remove the file; `recipes add-registry` rewrites it")
        fix = "it should read `registries: {NAME: {url: URL, trusted: false}}`; `recipes add-registry` rewrites it"
        entries = doc.get("registries") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not isinstance(entries or {}, dict):
            raise UsageError(f"{path}: not a mapping with a `registries:` mapping", fix)
        for name, entry in (entries or {}).items():
            if not isinstance(entry, dict):  # one bad entry: the other registries still serve
                _warn(UsageError(f"{path}: registry {name!r} is {entry!r}, not a mapping; skipped", fix))
                continue
            found[str(name)] = Registry(str(name), str(entry.get("url", "")), entry.get("trusted") is True,
                                        clones_dir() / str(name))
    ours = list(found.values())
    theirs = sparkrun_clones_dir()
    if theirs.is_dir():
        trusted = _sparkrun_trusted()
        # `_url_<hash>` is sparkrun's one clone of a repository that several of its registries share, not a
        # registry: taken for one, every recipe of those registries would be in two registries.
        for clone in sorted(p for p in theirs.iterdir() if p.is_dir() and not p.name.startswith("_url_")):
            if clone.name not in found:
                found[clone.name] = Registry(clone.name, "", clone.name in trusted, clone, "sparkrun")
    for reg in ours:  # a repository declaring several registries exposes each, as sparkrun adds each
        for name, where in _declared(reg):
            taken = found.get(name)
            if _reserved(name, reg.url):
                _warn_once(UsageError(f"{where}: registry {reg.name!r} declares {name!r}, a name reserved for the "
                                      f"community's own registries (GitHub {', '.join(RESERVED_OWNERS)}); not exposed",
                                      "only a repository of theirs may declare it: rename it in the manifest"))
            elif taken is not None and taken.url != reg.url:
                _warn_once(UsageError(f"{where}: registry {reg.name!r} declares {name!r}, which is already "
                                      f"{_whose(taken)}; @{name}/... stays that one",
                                      "rename it in the manifest, or remove the other with `sparkcluster recipes "
                                      "remove-registry`"))
            elif taken is None:
                found[name] = Registry(name, reg.url, reg.trusted, reg.clone, f"declared by {reg.name}")
    return found


def _whose(reg: Registry) -> str:
    if reg.origin == "sparkrun":
        return f"sparkrun's registry (its clone {reg.clone})"
    if reg.origin == "sparkcluster":
        return f"the registry added from {reg.url}"
    return f"the registry {reg.origin} ({reg.url})"


def _declared(reg: Registry) -> list[tuple[str, str]]:
    """(name, manifest:line) of each registry the manifest of `reg`'s clone declares besides the one `reg` itself
    is: its own name, or the first where its name is not declared (layout() reads that one's folders). Nothing
    where it has no readable manifest (its layout() says why)."""
    manifest = reg.clone / ".sparkrun" / "registry.yaml"
    try:
        doc = load_last_wins(manifest.read_text())[0] if manifest.is_file() else None
    except (OSError, UnicodeDecodeError, yamlsource.YamlError):
        return []
    entries = doc.get("registries") if isinstance(doc, dict) else None
    named = [(e.get("name"), f"{manifest}:{_key_line(e, 'name')}") for e in entries if isinstance(e, dict)] \
        if isinstance(entries, list) else []
    names = [(n, where) for n, where in named if isinstance(n, str) and REGISTRY_NAME.fullmatch(n)]
    itself = reg.name if any(n == reg.name for n, _ in named) else named[0][0] if named else None
    return [(n, where) for n, where in names if n != itself]


def _reserved(name: str, url: str) -> bool:
    """sparkrun's rule for every registry name, typed or declared: one starting with a reserved prefix needs a
    URL of the community's own GitHub owners."""
    return name.lower().startswith(RESERVED_PREFIXES) and not _community_url(url)


def _sparkrun_trusted() -> set[str]:
    """Names sparkrun's own config marks `trusted: true` (~/.config/sparkrun/registries.yaml)."""
    path = _home("XDG_CONFIG_HOME", ".config") / "sparkrun" / "registries.yaml"
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return set()
    entries = doc.get("registries") if isinstance(doc, dict) else doc
    if isinstance(entries, dict):
        entries = [{"name": k, **(v or {})} for k, v in entries.items()]
    return {str(e.get("name")) for e in entries or [] if isinstance(e, dict) and e.get("trusted") is True}


def _write(entries: dict[str, Registry]) -> None:
    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"registries": {r.name: {"url": r.url, "trusted": r.trusted} for r in entries.values()
                          if r.origin == "sparkcluster"}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))  # in the order added: the first to declare a name keeps it
    tmp.replace(path)


def add(name: str, url: str, trust: bool) -> tuple[Registry, str]:
    """Clones it (or refreshes the clone) and records it; returns it and what happened."""
    if not REGISTRY_NAME.fullmatch(name):
        raise UsageError(f"registry name {name!r} must be ASCII letters, digits, '-' or '_'", "e.g. `my-recipes`")
    if url.startswith("-"):  # git would read it as one of its options
        raise UsageError(f"registry URL {url!r} starts with '-'", "give a git URL or a path (./-name for a path)")
    if _reserved(name, url):
        raise UsageError(f"registry name {name!r} is reserved for the community's own registries (GitHub "
                         f"{', '.join(RESERVED_OWNERS)})", "choose another name for this registry")
    if "://" not in url and ":" not in url.split("/")[0] and Path(url).expanduser().exists():
        url = str(Path(url).expanduser().resolve())
    entries = registries()
    reg = Registry(name, url, trust, clones_dir() / name)
    said = _sync(reg)
    entries[name] = reg
    _write(entries)
    registries()  # the names its manifest declares are checked now: one refused or taken is told at once
    return reg, said


def _community_url(url: str) -> bool:
    """A GitHub repository of one of the community's owners: `https://github.com/OWNER/...` or the scp form
    `git@github.com:OWNER/...`, read as git reads it (the host is the host, not text anywhere in the URL). A path
    with a `.` or `..` segment (percent-encoded or not) is refused: git and curl normalise
    `github.com/eugr/../attacker/x` to attacker's repository."""
    scp = re.fullmatch(r"(?:[^@/:]+@)?([^@/:]+):([^/].*)", url) if "://" not in url else None
    if scp:
        host, path = scp.group(1), scp.group(2)
    else:
        parts = urlsplit(url)
        host, path = parts.hostname or "", parts.path
    segments = [unquote(s) for s in path.lstrip("/").split("/")]
    if any(s in (".", "..") or "/" in s or "\\" in s for s in segments):
        return False
    return host.lower() == "github.com" and segments[0].lower() in RESERVED_OWNERS


@dataclass(frozen=True)
class Synced:
    """What `recipes update` did to one registry; `ok` is false where there is no usable copy."""

    said: str
    ok: bool = True


def update() -> dict[str, Synced]:
    """Every registry of ours refreshed: name -> what happened. One failing does not stop the others (a
    failure keeps the last good copy where there is one)."""
    results = {}
    for reg in registries().values():
        if reg.origin != "sparkcluster":
            continue
        try:
            results[reg.name] = Synced(_sync(reg))
        except SparkclusterError as e:
            results[reg.name] = Synced(f"failed: {e.message} ({e.fix})", ok=False)
    return results


def _sync(reg: Registry) -> str:
    """Pulls the clone, or clones afresh where there is none or it was cloned from another URL (a registry
    re-added under its name with a new URL must not keep serving the old one's recipes)."""
    reg.clone.parent.mkdir(parents=True, exist_ok=True)
    current = _origin_url(reg.clone) if (reg.clone / ".git").exists() else None
    if current is not None and current == reg.url:
        cmd = ["git", "-C", str(reg.clone), "pull", "--ff-only", "--quiet"]
        verb = "updated"
    else:
        tmp = reg.clone.with_name(reg.clone.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = ["git", "clone", "--quiet", "--depth", "1", "--", reg.url, str(tmp)]
        verb = "cloned" if current is None else f"cloned afresh (it was cloned from {current})"
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                                env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
        ok, why = result.returncode == 0, result.stderr.strip().splitlines()[-1:] or ["git failed"]
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, [str(e)]
    if not ok:
        if reg.clone.is_dir() and current == reg.url:
            return f"could not be updated ({why[0]}); keeping the last good copy"
        raise SparkclusterError(f"registry {reg.name}: cloning {reg.url} failed: {why[0]}",
                                "check the URL or path and the network, then run the command again")
    if verb != "updated":
        shutil.rmtree(reg.clone, ignore_errors=True)
        tmp.replace(reg.clone)
    return verb


def _origin_url(clone: Path) -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(clone), "config", "--get", "remote.origin.url"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    url = result.stdout.strip() if result.returncode == 0 else ""
    return url or None


def recipe_files(reg: Registry) -> list[Path]:
    """The YAML files below the registry's recipes folder, walked without following links to folders; a file
    that is a link out of the folder is not the registry's recipe and is left out."""
    recipes, _ = reg.layout()
    if not recipes.is_dir():
        return []
    root = paths.real(recipes)
    found = []
    for folder, dirs, files in os.walk(recipes):  # an unreadable or vanishing folder is skipped, never raised
        dirs[:] = [d for d in dirs if d not in (".git", ".sparkrun")]
        if Path(folder).name == "mods":
            continue
        found += [Path(folder) / f for f in files if f.endswith((".yaml", ".yml"))]
    return sorted(p for p in found if p.is_file() and paths.real(p).is_relative_to(root))


def _find_in(reg: Registry, rest: str) -> list[Path]:
    recipes, _ = reg.layout()
    direct = [f"{rest}{ext}" for ext in ("", ".yaml", ".yml")] if "/" in rest else []  # a path (`qwen3.6/vllm/x`)
    for name in [*direct, f"{rest}.yaml", f"{rest}.yml"]:  # then flat
        try:
            found = paths.lookup(recipes, name)
        except paths.Outside as e:
            raise UsageError(f"@{reg.name}/{rest} leads out of the registry {reg.name!r}'s recipes folder "
                             f"({e.folder}), to {e.found}",
                             f"name a recipe inside it (`sparkcluster recipes list --registry {reg.name}`); another "
                             "registry's recipe is @THAT/NAME") from None
        if found is not None and found.is_file():
            return [recipes / name]
    return [p for p in recipe_files(reg) if p.stem == rest]


def _found(reg: Registry, path: Path) -> Found:
    return Found(path, reg.name, reg.trusted, (*registry_mods_dirs(reg.name, reg), *_eugr_places(reg.name)))


def _eugr_places(registry: str | None) -> list[ModPlace]:
    """sparkrun's fallback for every recipe's mods: eugr's mods folder, as trusted as eugr is."""
    fallback = registries().get("eugr")
    if registry != "eugr" and fallback in _usable({"eugr": fallback} if fallback else {}):
        return registry_mods_dirs("eugr", fallback)
    return []


def registry_clones() -> list[paths.Clone]:
    """Every clone on this machine and whose it is: each registry's, then any other folder where clones live (a
    registry's leftovers, sparkrun's internal clones) as nobody's trusted code."""
    clones = [paths.Clone(paths.real(reg.clone), reg.name, reg.trusted) for reg in registries().values()]
    known = {c.path for c in clones}
    for parent in (clones_dir(), sparkrun_clones_dir()):
        if parent.is_dir():
            clones += [paths.Clone(paths.real(p), p.name, False) for p in sorted(parent.iterdir())
                       if p.is_dir() and paths.real(p) not in known]
    return clones


def file_home(path: Path) -> Found:
    """Whose a recipe file given by path is, by where it really is, and where its mods are looked for besides
    beside it. A file in a registry's clone is that registry's (its trust, its mods folder, then eugr's); one in
    a clone of no registry is nobody's trusted code; any other file is the user's own, whose mods are also looked
    for in the mods folder its own repository's manifest declares, then in eugr's, as sparkrun finds them."""
    at = paths.real(path)
    clone = paths.owner(at, registry_clones())
    if clone is not None:
        sharing = [reg for reg in registries().values() if paths.real(reg.clone) == clone.path]
        for reg in sharing:  # of registries sharing a clone, the one whose recipes folder holds the file
            if paths.is_inside(at, reg.layout()[0]):
                return _found(reg, path)
        if sharing:
            return _found(sharing[0], path)
        return Found(path, clone.registry, False, tuple(_eugr_places(clone.registry)))
    return Found(path, None, True, (*_repository_mods(at), *_eugr_places(None)))


def _repository_mods(recipe: Path) -> list[ModPlace]:
    """The mods folder that the manifest at the root of a recipe file's repository declares for the registry
    whose recipes folder holds the file: a registry's checkout, given by file, finds its mods as its registry
    would."""
    for root in list(recipe.parents)[:8]:
        manifest = root / ".sparkrun" / "registry.yaml"
        if manifest.is_file():
            try:
                doc = load_last_wins(manifest.read_text())[0]
            except (OSError, UnicodeDecodeError, yamlsource.YamlError):
                return []
            entries = doc.get("registries") if isinstance(doc, dict) else None
            names = [str(e.get("name")) for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
            for name in names:
                try:
                    recipes, mods = Registry(name, "", True, root).layout()
                except UsageError as e:
                    _warn(e)
                    return []
                if mods is not None and paths.is_inside(recipe, recipes):
                    return [ModPlace(mods, None, True)]
            return []
        if (root / ".git").exists():
            break
    return []


def resolve_scoped(ref: str) -> Found:
    """`@REG/NAME` (NAME may hold slashes: the registry is split at the first one)."""
    name, _, rest = ref[1:].partition("/")
    regs = registries()
    if name not in regs:
        raise UsageError(f"no registry named {name!r}{did_you_mean(name, list(regs))}",
                         f"add it: `sparkcluster recipes add-registry {name} GIT_URL_OR_PATH`")
    if not rest:
        raise UsageError(f"{ref} names no recipe", f"write @{name}/RECIPE (`sparkcluster recipes list --registry {name}`)")
    hits = _find_in(regs[name], rest)
    if not hits:
        stems = [p.stem for p in recipe_files(regs[name])]
        raise UsageError(f"registry {name!r} has no recipe {rest!r}{did_you_mean(rest, stems)}",
                         f"see `sparkcluster recipes list --registry {name}`; `recipes update` refreshes it")
    if len(hits) > 1:
        raise UsageError(f"{ref} is ambiguous: " + ", ".join(f"@{name}/{_rel(regs[name], p)}" for p in hits),
                         "name one of them by its path")
    return _found(regs[name], hits[0])


def _warn(e: UsageError) -> None:
    err_console.print(f"warning: {e.message} ({e.fix})", highlight=False, markup=False)


_warned: set[str] = set()


def _warn_once(e: UsageError) -> None:
    """A warning about the registries themselves, once a command: they are listed again at every lookup."""
    if e.message not in _warned:
        _warned.add(e.message)
        _warn(e)


def _usable(regs: dict[str, Registry]) -> list[Registry]:
    """The registries whose layout can be read; a broken one is warned about and skipped, so that it does not
    break lookups in the others."""
    usable = []
    for reg in regs.values():
        try:
            reg.layout()
        except UsageError as e:
            _warn(e)
            continue
        usable.append(reg)
    return usable


def resolve_unscoped(name: str) -> Found | None:
    """A bare name searched in every registry; found in two is an error naming both."""
    hits = [(reg, path) for reg in _usable(registries()) for path in _find_in(reg, name)]
    if len(hits) > 1:
        raise UsageError(f"recipe {name!r} is in more than one registry: "
                         + ", ".join(f"@{reg.name}/{_rel(reg, p)}" for reg, p in hits), "name one of them")
    return _found(*hits[0]) if hits else None


def _rel(reg: Registry, path: Path) -> str:
    recipes, _ = reg.layout()
    return path.relative_to(recipes).with_suffix("").as_posix()


def remove(name: str) -> Registry:
    """Forgets a registry of ours and deletes its clone: a clone left behind would still hold its files (and a
    path into it is nobody's trusted code). sparkrun's registries are sparkrun's to remove."""
    if not REGISTRY_NAME.fullmatch(name):  # it names a folder below the clones: never `..` or a path
        raise UsageError(f"registry name {name!r} must be ASCII letters, digits, '-' or '_'", "see `sparkcluster recipes list`")
    regs = registries()
    reg = regs.get(name)
    if reg is not None and reg.origin.startswith("declared by "):
        owner = reg.origin.removeprefix("declared by ")
        raise UsageError(f"registry {name!r} is declared by the repository of registry {owner!r}",
                         f"remove that one: `sparkcluster recipes remove-registry {owner}`")
    if reg is not None and reg.origin != "sparkcluster":
        raise UsageError(f"registry {name!r} is sparkrun's (its clone {reg.clone} is read as it is)",
                         f"remove it with sparkrun: `sparkrun registry remove {name}`")
    if reg is None:
        raise UsageError(f"no registry named {name!r}{did_you_mean(name, list(regs))}",
                         "see `sparkcluster recipes list`; a registry removed once is gone")
    del regs[name]
    _write(regs)
    for clone in (reg.clone, reg.clone.with_name(reg.clone.name + ".partial")):
        shutil.rmtree(clone, ignore_errors=True)
    return reg


def registry_mods_dirs(name: str, reg: Registry | None = None) -> list[ModPlace]:
    """The registry's mods folder, carrying the registry's name and trust."""
    reg = reg or registries().get(name)
    mods = reg.layout()[1] if reg else None
    return [ModPlace(mods, reg.name, reg.trusted)] if reg and mods else []


def listing(only: str | None = None) -> list[tuple[str, str, Path]]:
    """(registry, @REG/NAME, file) of every registry recipe."""
    regs = registries()
    if only is not None and only not in regs:
        raise UsageError(f"no registry named {only!r}{did_you_mean(only, list(regs))}", "see `sparkcluster recipes list`")
    if only is not None:
        regs[only].layout()  # named: its own error, not a warning
    return [(reg.name, f"@{reg.name}/{_rel(reg, p)}", p) for reg in _usable(regs) if only in (None, reg.name)
            for p in recipe_files(reg)]
