"""One registry: its clone, and the folders in it its manifest (`.sparkrun/registry.yaml`) names for recipes and
mods, or sparkrun's defaults for the registries it ships; a folder outside the clone is refused."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...engine import yamlsource
from ...engine.errors import UsageError
from .. import paths
from ..yamlfile import load_last_wins

# sparkrun's defaults for the registries it ships, where a clone's manifest does not say (subpath, mods).
KNOWN_LAYOUTS = {"eugr": ("recipes", "mods"), "official": ("official-recipes", "official-mods"),
                 "experimental": ("experimental-recipes", "experimental-mods"), "community": ("recipes", None),
                 "sparkrun-testing": ("testing/recipes", None), "sparkrun-transitional": ("transitional/recipes", None)}
MANIFEST_FIX = ("a registry's folders are paths inside its repository: fix its .sparkrun/registry.yaml, or "
                "`sparkcluster recipes remove-registry NAME`")


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
                return (self._folder(entry.get("recipes") or "", f"{manifest}:{key_line(entry, 'recipes')}", "recipes"),
                        self._folder(mods, f"{manifest}:{key_line(entry, 'mods')}", "mods") if mods else None)
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


def key_line(entry: object, key: str) -> int:
    return entry.key_line(key) if isinstance(entry, yamlsource.SourceMap) and key in entry else 1
