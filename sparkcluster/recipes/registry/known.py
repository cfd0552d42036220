"""Which registries this machine knows: ours (the config file, in the order added), sparkrun's clones, and those
our clones' manifests declare; the names reserved for the community's own registries; the warnings about them."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

from ...engine import yamlsource
from ...engine.console import err as err_console
from ...engine.errors import UsageError
from ..yamlfile import load_last_wins
from .layout import Registry, key_line

# sparkrun reserves these names for the projects' own repositories, so that nobody's registry passes for the
# community's (a mod falls back to the `eugr` registry's folder): a name starting with one needs their URL.
RESERVED_PREFIXES = ("arena", "spark-arena", "sparkarena", "sparkrun", "official", "experimental", "transitional",
                     "community", "eugr", "dbotwinick", "raphaelamorim", "scitrera")
RESERVED_OWNERS = ("spark-arena", "scitrera", "eugr", "dbotwinick", "raphaelamorim")
# The exact ASCII spelling: a Cyrillic `е` in `еugr` is another name that reads as eugr.
REGISTRY_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _home(var: str, default: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / default)


def config_file() -> Path:
    return _home("XDG_CONFIG_HOME", ".config") / "sparkcluster" / "registries.yaml"


def clones_dir() -> Path:
    return _home("XDG_CACHE_HOME", ".cache") / "sparkcluster" / "registries"


def sparkrun_clones_dir() -> Path:
    return _home("XDG_CACHE_HOME", ".cache") / "sparkrun" / "registries"


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
                warn(UsageError(f"{path}: registry {name!r} is {entry!r}, not a mapping; skipped", fix))
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
            if reserved(name, reg.url):
                warn_once(UsageError(f"{where}: registry {reg.name!r} declares {name!r}, a name reserved for the "
                                      f"community's own registries (GitHub {', '.join(RESERVED_OWNERS)}); not exposed",
                                      "only a repository of theirs may declare it: rename it in the manifest"))
            elif taken is not None and taken.url != reg.url:
                warn_once(UsageError(f"{where}: registry {reg.name!r} declares {name!r}, which is already "
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
    named = [(e.get("name"), f"{manifest}:{key_line(e, 'name')}") for e in entries if isinstance(e, dict)] \
        if isinstance(entries, list) else []
    names = [(n, where) for n, where in named if isinstance(n, str) and REGISTRY_NAME.fullmatch(n)]
    itself = reg.name if any(n == reg.name for n, _ in named) else named[0][0] if named else None
    return [(n, where) for n, where in names if n != itself]


def reserved(name: str, url: str) -> bool:
    """sparkrun's rule for every registry name, typed or declared: one starting with a reserved prefix needs a
    URL of the community's own GitHub owners."""
    return name.lower().startswith(RESERVED_PREFIXES) and not _community_url(url)


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


def warn(e: UsageError) -> None:
    err_console.print(f"warning: {e.message} ({e.fix})", highlight=False, markup=False)


_warned: set[str] = set()


def warn_once(e: UsageError) -> None:
    """A warning about the registries themselves, once a command: they are listed again at every lookup."""
    if e.message not in _warned:
        _warned.add(e.message)
        warn(e)
