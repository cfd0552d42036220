"""Mods: a directory with run.sh that a recipe names under `mods:`, found as eugr and sparkrun find it, then copied
to every node and run in every serving environment before vLLM starts.

A mod runs with WORKSPACE_DIR set to the directory vLLM starts in (sparkrun: `export WORKSPACE_DIR=$PWD && cd
/workspace/mods/<name> && chmod +x run.sh && ./run.sh`), so a chat template it drops there is found by the
command's relative `--chat-template NAME.jinja`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from ..engine.errors import UsageError
from .types import Mod, ModPlace

NODE_MODS_DIR = ".cache/sparkcluster/mods"  # under the node user's home: where every mod lands
MAX_MOD_BYTES = 64 * 1024 * 1024  # a patch set, templates, a script: not a model
MOD_NAME = re.compile(r"[A-Za-z0-9._-]+")


def resolve_mod(given: str, where: str, places: Sequence[ModPlace]) -> Mod:
    """`given` as the recipe wrote it: `@REG/rel` in that registry's mods, else beside the recipe (`rel`,
    `mods/rel`) and up its tree, then the recipe's registry's mods folder (in `places`). The mod carries the
    registry and trust of the place it was found in."""
    rel = given.strip()
    candidates: list[tuple[Path, ModPlace]] = []
    if rel.startswith("@"):
        from .registry import registry_mods_dirs

        registry, _, rest = rel[1:].partition("/")
        candidates += [(d.path / rest.removeprefix("mods/"), d) for d in registry_mods_dirs(registry)]
    else:
        stripped = rel.removeprefix("mods/")
        for place in places:
            candidates += [(place.path / rel, place), (place.path / "mods" / stripped, place),
                           (place.path / stripped, place)]
        if Path(rel).expanduser().is_absolute():  # chosen by whoever wrote the recipe: theirs to vouch for
            candidates.insert(0, (Path(rel).expanduser(), places[0] if places else ModPlace(Path("/"))))
    seen = [(c, place) for c, place in candidates if c.is_dir()]
    if not seen:
        looked = ", ".join(dict.fromkeys(str(c) for c, _ in candidates)) or "(nowhere: the recipe has no folder)"
        raise UsageError(f"{where}: mod {given!r} is not found (looked in {looked})",
                         "put the mod directory next to the recipe (mods/NAME/run.sh), or fix its name")
    found, place = seen[0][0].resolve(), seen[0][1]
    if not MOD_NAME.fullmatch(found.name):  # the name becomes a folder and words of the nodes' shell lines
        raise UsageError(f"{where}: mod {given!r} is in a directory named {found.name!r}, which is not a mod name",
                         "rename the mod's directory with letters, digits, '.', '_' or '-' only")
    if not (found / "run.sh").is_file():
        raise UsageError(f"{where}: mod {given!r} ({found}) has no run.sh", "a mod is a directory with run.sh in it")
    size = sum(f.stat().st_size for f in found.rglob("*") if f.is_file())
    if size > MAX_MOD_BYTES:
        raise UsageError(f"{where}: mod {given!r} holds {size / 1e6:.0f} MB", "a mod patches and drops small files")
    return Mod(found.name, found, given, place.registry, place.trusted)


def mod_files(mod: Mod) -> list[tuple[str, bytes, int]]:
    """(path relative to the mod, content, mode) of every file, in a stable order."""
    files = []
    for path in sorted(p for p in mod.path.rglob("*") if p.is_file()):
        mode = 0o755 if path.name == "run.sh" or path.stat().st_mode & 0o100 else 0o644
        files.append((path.relative_to(mod.path).as_posix(), path.read_bytes(), mode))
    return files


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
