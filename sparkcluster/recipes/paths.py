"""Where a name a recipe gives really is, and whose code it is.

A recipe names other files (a mod, an include, `@REG/rel`), the user names a recipe file, and sparkrun's eugr
fallback names a folder of another registry. Each name is looked up in a folder: it is joined onto the folder and
resolved as the operating system would open it (`..` segments and every symlink followed), and it must then still
lie inside that folder. A name that leads out of its folder is refused, never "found" elsewhere: `@good/../../evil`
would otherwise be evil's file under good's name.

Whose a file is (trusted or not) is decided by where it really is: the registry clone that holds it, however the
path to it was spelled or linked; a file in no clone is the user's own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class Outside(Exception):
    """A name that exists, but outside the folder it was looked up in."""

    def __init__(self, found: Path, folder: Path) -> None:
        super().__init__(f"{found} is outside {folder}")
        self.found = found
        self.folder = folder


@dataclass(frozen=True)
class Clone:
    """A registry's clone on this machine: every file below `path` (a resolved path) is that registry's."""

    path: Path
    registry: str
    trusted: bool


def real(path: Path) -> Path:
    """The path with every symlink and `..` resolved, whether or not its last parts exist (a symlink loop is
    left as it is: nothing is found there)."""
    return Path(os.path.realpath(path))


def lookup(folder: Path, name: str, within: Path | None = None) -> Path | None:
    """`name` joined onto `folder` as the system opens it: its real path, or None where nothing is there. A name
    that exists outside `within` (by default `folder` itself), by `..`, an absolute part or a symlink anywhere on
    the way, raises Outside."""
    root = real(within or folder)
    try:
        found = (folder / name).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, not a folder on the way, a symlink loop, a NUL byte
        return None
    if not found.is_relative_to(root):
        raise Outside(found, root)
    return found


def is_inside(path: Path, folder: Path) -> bool:
    """`path` (resolved here) lies in `folder` (resolved here) or is it."""
    return real(path).is_relative_to(real(folder))


def owner(found: Path, clones: Iterable[Clone]) -> Clone | None:
    """The clone that really holds `found` (the innermost, should one clone hold another), or None: the user's.
    Registries that share one clone (a repository declaring several) make it trusted only if all of them are."""
    at = real(found)
    holding = [c for c in clones if at.is_relative_to(c.path)]
    if not holding:
        return None
    deepest = max(len(c.path.parts) for c in holding)
    sharing = [c for c in holding if len(c.path.parts) == deepest]
    return Clone(sharing[0].path, sharing[0].registry, all(c.trusted for c in sharing))
