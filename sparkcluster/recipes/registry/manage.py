"""Adding, refreshing and removing registries of ours: the config file that records them, and their clones, brought
up to date with git (a failed pull keeps the last good copy)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from ...engine.errors import SparkclusterError, UsageError, did_you_mean
from .known import REGISTRY_NAME, RESERVED_OWNERS, clones_dir, config_file, registries, reserved
from .layout import Registry

GIT_TIMEOUT_S = 300


def add(name: str, url: str, trust: bool) -> tuple[Registry, str]:
    """Clones it (or refreshes the clone) and records it; returns it and what happened."""
    if not REGISTRY_NAME.fullmatch(name):
        raise UsageError(f"registry name {name!r} must be ASCII letters, digits, '-' or '_'", "e.g. `my-recipes`")
    if url.startswith("-"):  # git would read it as one of its options
        raise UsageError(f"registry URL {url!r} starts with '-'", "give a git URL or a path (./-name for a path)")
    if reserved(name, url):
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


def _write(entries: dict[str, Registry]) -> None:
    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"registries": {r.name: {"url": r.url, "trusted": r.trusted} for r in entries.values()
                          if r.origin == "sparkcluster"}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))  # in the order added: the first to declare a name keeps it
    tmp.replace(path)


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
