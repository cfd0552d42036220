"""Mods: a directory with run.sh that a recipe names under `mods:`, found as eugr and sparkrun find it, then copied
to every node and run in every serving environment before vLLM starts.

A mod runs with WORKSPACE_DIR set to the directory vLLM starts in (sparkrun: `export WORKSPACE_DIR=$PWD && cd
/workspace/mods/<name> && chmod +x run.sh && ./run.sh`), so a chat template it drops there is found by the
command's relative `--chat-template NAME.jinja`.

Where a mod is decides whose code it is (paths.py): a name must stay inside the folder it is looked up in, and the
mod is as trusted as that folder and the clone that really holds it. Its files are what lies inside it: a symlink
out of the mod is refused (a registry's `loot -> ~/.ssh/id_ed25519` must never reach the nodes), a link inside it
is copied as the file it points at, and every file keeps its own mode (never widened). A hard link is a file with
names elsewhere too (`ln ~/secret.txt mods/x/notes`): one whose other names are not all inside the mod is refused,
since nothing in the mod says which file of this machine it is (git carries no hard links, so only a user's own
folder can hold one).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Sequence
from pathlib import Path

from ..engine.errors import UsageError, did_you_mean
from . import paths
from .types import Mod, ModPlace

NODE_MODS_DIR = ".cache/sparkcluster/mods"  # under the node user's home: where every mod lands
MAX_MOD_BYTES = 64 * 1024 * 1024  # a patch set, templates, a script: not a model
MOD_NAME = re.compile(r"[A-Za-z0-9._-]+")
LINK_FIX = "a mod holds its own files: copy the file into the mod instead of linking to it"


def resolve_mod(given: str, where: str, places: Sequence[ModPlace]) -> Mod:
    """`given` as the recipe wrote it: `@REG/rel` in that registry's mods, else beside the recipe (`rel`,
    `mods/rel`) and up its tree, then the recipe's registry's mods folder and eugr's (in `places`). A name that
    leads out of the folder it is looked up in is refused; the mod is as trusted as its folder and the clone that
    really holds it, and carries that clone's registry."""
    rel = given.strip()
    looks: list[tuple[ModPlace, str]] = []
    if rel.startswith("@"):
        scope, _, rest = rel[1:].partition("/")
        looks += [(d, rest.removeprefix("mods/")) for d in _registry_mods(scope, given, where)]
    elif Path(rel).expanduser().is_absolute():  # chosen by whoever wrote the recipe: no more trusted than they are
        home = places[0] if places else ModPlace(Path("/"))
        looks.append((ModPlace(Path("/"), home.registry, home.trusted), str(Path(rel).expanduser())))
    else:
        stripped = rel.removeprefix("mods/")
        for place in places:
            looks += [(place, rel), (place, f"mods/{stripped}"), (place, stripped)]
    found, place = _first_dir(given, where, looks)
    if not MOD_NAME.fullmatch(found.name):  # the name becomes a folder and words of the nodes' shell lines
        raise UsageError(f"{where}: mod {given!r} is in a directory named {found.name!r}, which is not a mod name",
                         "rename the mod's directory with letters, digits, '.', '_' or '-' only")
    from .registry import registry_clones

    clone = paths.owner(found, registry_clones())
    registry = clone.registry if clone else place.registry
    trusted = place.trusted and (clone.trusted if clone else True)
    shown = f"{where}: mod {given!r} ({found}{f', registry {registry!r}' if registry else ''})"
    files = _walk(found, shown)
    if "run.sh" not in {rel for rel, _, _ in files}:
        raise UsageError(f"{shown} has no run.sh", "a mod is a directory with run.sh in it")
    size = sum(real.stat().st_size for _, real, _ in files)
    if size > MAX_MOD_BYTES:
        raise UsageError(f"{shown} holds {size / 1e6:.0f} MB", "a mod patches and drops small files")
    return Mod(found.name, found, given, registry, trusted)


def _registry_mods(scope: str, given: str, where: str) -> list[ModPlace]:
    """The mods folder of the registry `@scope/` names; a registry that does not exist, or has no mods folder,
    is said to be so (names are case-sensitive: `@GOODREG` is not `goodreg`)."""
    from .registry import registries, registry_mods_dirs

    regs = registries()
    if scope not in regs:
        same = [name for name in regs if name.lower() == scope.lower()]
        hint = f" (did you mean {same[0]!r}? registry names are case-sensitive)" if same else did_you_mean(scope, regs)
        raise UsageError(f"{where}: mod {given!r} names the registry {scope!r}, which does not exist{hint}",
                         "write @REGISTRY/MOD with a registry of `sparkcluster recipes list`, or add it: "
                         f"`sparkcluster recipes add-registry {scope} GIT_URL_OR_PATH`")
    places = registry_mods_dirs(scope, regs[scope])
    if not places:
        raise UsageError(f"{where}: mod {given!r}: the registry {scope!r} has no mods folder",
                         "its manifest (.sparkrun/registry.yaml) names none, and it has no mods/ folder: "
                         "name a mod of another registry, or one beside the recipe")
    return places


def _first_dir(given: str, where: str, looks: Sequence[tuple[ModPlace, str]]) -> tuple[Path, ModPlace]:
    """The first name that is a directory inside its folder; one that leads out of its folder is refused."""
    for place, name in looks:
        within = place.within or place.path
        try:
            found = paths.lookup(place.path, name, within)
        except paths.Outside as e:
            raise UsageError(f"{where}: mod {given!r} leads out of {_described(place)} ({e.folder}), to {e.found}",
                             "a mod is a directory inside the folder it is looked up in; name another "
                             "registry's mod as @REGISTRY/NAME") from None
        if found is not None and found.is_dir():
            return found, place
    looked = ", ".join(dict.fromkeys(str(p.path / n) for p, n in looks)) or "(nowhere: the recipe has no folder)"
    raise UsageError(f"{where}: mod {given!r} is not found (looked in {looked})",
                     "put the mod directory next to the recipe (mods/NAME/run.sh), or fix its name")


def _described(place: ModPlace) -> str:
    return f"the registry {place.registry!r}'s {place.kind}" if place.registry else f"the {place.kind}"


def _walk(mod_dir: Path, shown: str) -> list[tuple[str, Path, int]]:
    """(path relative to the mod, the real file, the mode it lands with) of every file of the mod, sorted. A link
    inside the mod reads as what it points at; a link out of it, a dangling link or a loop, and anything that is
    not a regular file (a FIFO would hang the read, a device would be read) are refused."""
    root = paths.real(mod_dir)
    files: list[tuple[str, Path, int]] = []
    names: dict[tuple[int, int], set[Path]] = {}  # each file's names inside the mod, by (device, inode)
    links: dict[tuple[int, int], tuple[str, int]] = {}  # a name of it and how many names it has in all

    def visit(folder: Path, prefix: str, above: tuple[Path, ...]) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise UsageError(f"{shown}: {prefix or '.'} cannot be read: {e.strerror}", "check its permissions") from None
        for entry in entries:
            rel = f"{prefix}{entry.name}"
            try:
                target = Path(entry.path).resolve(strict=True)
            except (OSError, RuntimeError):
                raise UsageError(f"{shown}: {rel} is a symlink to nothing (or to itself)", LINK_FIX) from None
            if not target.is_relative_to(root):
                raise UsageError(f"{shown}: {rel} is a symlink out of the mod (to {target})", LINK_FIX)
            st = target.stat()
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                if target in above:
                    raise UsageError(f"{shown}: {rel} is a symlink to a folder that holds it", LINK_FIX)
                visit(target, f"{rel}/", (*above, target))
            elif stat.S_ISREG(mode):
                names.setdefault((st.st_dev, st.st_ino), set()).add(target)
                links[(st.st_dev, st.st_ino)] = (rel, st.st_nlink)
                files.append((rel, target, _mode(mode, rel)))
            else:
                raise UsageError(f"{shown}: {rel} is not a regular file", "a mod holds regular files and folders")

    visit(root, "", (root,))
    for inode, (rel, count) in links.items():
        if count > len(names[inode]):
            raise UsageError(f"{shown}: {rel} is a hard link: the file has {count} names, "
                             f"{count - len(names[inode])} of them outside the mod, so it may be any file of this "
                             "machine", "copy the file into the mod (`cp --remove-destination SOURCE "
                             f"{rel}`) instead of linking it")
    return files


def _mode(st_mode: int, rel: str) -> int:
    """The file's own permission bits, never wider: no group or other write, no setuid; the owner may always
    read and replace it (a later serve rewrites it), and run.sh is the owner's to run."""
    mode = (st_mode & 0o755) | 0o600
    return mode | 0o700 if rel == "run.sh" else mode


def mod_files(mod: Mod) -> list[tuple[str, bytes, int]]:
    """(path relative to the mod, content, mode) of every file, in a stable order; checked again here, whoever
    made the Mod, so that nothing outside the mod is ever read."""
    shown = f"mod {mod.name!r} ({mod.path}{f', registry {mod.registry!r}' if mod.registry else ''})"
    return [(rel, _read(real, shown), mode) for rel, real, mode in _walk(mod.path, shown)]


def _read(path: Path, shown: str) -> bytes:
    """A regular file's bytes, opened without following a link that appeared since the walk."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise UsageError(f"{shown}: {path} cannot be read: {e.strerror}", LINK_FIX) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise UsageError(f"{shown}: {path} is not a regular file", "a mod holds regular files and folders")
        return f.read()


def run_mods_line(mods: Sequence[Mod], mods_dir: str) -> str:
    """One shell line that runs each mod's run.sh in order from where it is started (vLLM's start directory),
    stopping at the first that fails; `mods_dir` holds them (a path the node's shell resolves)."""
    steps = []
    for mod in mods:
        where = f"{mods_dir}/{shlex.quote(mod.name)}"
        # quoted although load refuses odd names: a name is data here, never shell
        said = shlex.quote(f"mod {mod.name}")
        steps.append(f"echo {said}': running' && (cd {where} && chmod +x run.sh && ./run.sh) "
                     f"|| {{ rc=$?; echo {said}\" failed (exit $rc)\" >&2; exit $rc; }}")
    return "export WORKSPACE_DIR=\"$PWD\"; " + "; ".join(steps)
