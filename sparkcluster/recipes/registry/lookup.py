"""A recipe by name or by file, and whose it is: `@REG/NAME` in one registry, a bare name in every registry, a file
given by path by the clone that really holds it (its trust, its registry's mods folder, then eugr's); listings."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...engine import yamlsource
from ...engine.errors import UsageError, did_you_mean
from .. import paths
from ..types import ModPlace
from ..yamlfile import load_last_wins
from .known import clones_dir, registries, sparkrun_clones_dir, warn
from .layout import Registry


@dataclass(frozen=True)
class Found:
    path: Path
    registry: str | None  # None: the user's own file
    trusted: bool
    mods_dirs: tuple[ModPlace, ...]  # the registry's mods folder, then eugr's (each with its own trust)


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


def resolve_unscoped(name: str) -> Found | None:
    """A bare name searched in every registry; found in two is an error naming both."""
    hits = [(reg, path) for reg in _usable(registries()) for path in _find_in(reg, name)]
    if len(hits) > 1:
        raise UsageError(f"recipe {name!r} is in more than one registry: "
                         + ", ".join(f"@{reg.name}/{_rel(reg, p)}" for reg, p in hits), "name one of them")
    return _found(*hits[0]) if hits else None


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


def listing(only: str | None = None) -> list[tuple[str, str, Path]]:
    """(registry, @REG/NAME, file) of every registry recipe."""
    regs = registries()
    if only is not None and only not in regs:
        raise UsageError(f"no registry named {only!r}{did_you_mean(only, list(regs))}", "see `sparkcluster recipes list`")
    if only is not None:
        regs[only].layout()  # named: its own error, not a warning
    return [(reg.name, f"@{reg.name}/{_rel(reg, p)}", p) for reg in _usable(regs) if only in (None, reg.name)
            for p in recipe_files(reg)]


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


def registry_mods_dirs(name: str, reg: Registry | None = None) -> list[ModPlace]:
    """The registry's mods folder, carrying the registry's name and trust."""
    reg = reg or registries().get(name)
    mods = reg.layout()[1] if reg else None
    return [ModPlace(mods, reg.name, reg.trusted)] if reg and mods else []


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
                    warn(e)
                    return []
                if mods is not None and paths.is_inside(recipe, recipes):
                    return [ModPlace(mods, None, True)]
            return []
        if (root / ".git").exists():
            break
    return []


def _usable(regs: dict[str, Registry]) -> list[Registry]:
    """The registries whose layout can be read; a broken one is warned about and skipped, so that it does not
    break lookups in the others."""
    usable = []
    for reg in regs.values():
        try:
            reg.layout()
        except UsageError as e:
            warn(e)
            continue
        usable.append(reg)
    return usable


def _rel(reg: Registry, path: Path) -> str:
    recipes, _ = reg.layout()
    return path.relative_to(recipes).with_suffix("").as_posix()
