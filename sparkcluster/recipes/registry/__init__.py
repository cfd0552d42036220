"""Recipe registries: git repositories of recipes, cloned under the user's cache and named `@REG/NAME` as sparkrun
names them (the registry's `.sparkrun/registry.yaml` says where its recipes and mods are; a name is a file stem,
found flat first, then anywhere below; a name found twice is an error). Registries a user configured for
sparkrun (its clones under ~/.cache/sparkrun/registries) are usable as they are.

A registry is someone else's code once its recipes bring mods: it is untrusted until added with --trust. Every
name is resolved inside the folder it is looked up in (paths.py): `@REG/../other` is refused, and a manifest whose
folders lie outside its clone skips that registry. A file is as trusted as the clone that really holds it.

Its parts: layout (one registry's clone and folders), known (which registries there are, and reserved names),
manage (add, update, remove) and lookup (a recipe by name or file, and whose it is).
"""

from __future__ import annotations

from .known import _community_url as _community_url  # the reserved-name rule, tested on its own
from .known import clones_dir, config_file, registries, sparkrun_clones_dir
from .layout import Registry
from .lookup import (
    Found,
    file_home,
    listing,
    recipe_files,
    registry_clones,
    registry_mods_dirs,
    resolve_scoped,
    resolve_unscoped,
)
from .manage import Synced, add, remove, update

__all__ = ["Found", "Registry", "Synced", "add", "clones_dir", "config_file", "file_home", "listing", "recipe_files",
           "registries", "registry_clones", "registry_mods_dirs", "remove", "resolve_scoped", "resolve_unscoped",
           "sparkrun_clones_dir", "update"]
