"""Inventories: the hosts of a cluster, loaded and validated before any connection is made.

Two formats become the same `Inventory`: sparkcluster's own (name, vars, groups, hosts, models) and
Ansible's YAML inventory, read as is so one file can drive both tools. Every problem is an InventoryError
that starts with `file:line:` and carries a fix, and is exit 2 before any connection.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from .. import yamlsource
from ..yamlsource import SourceList, SourceMap, describe
from .ansible import is_ansible, load_ansible
from .model import HEAD, WORKER, Host, Inventory, InventoryError, Source
from .native import load_native

# The readers and the shared checks live in inventory_native, inventory_ansible and inventory_values; the
# values they build are defined in inventory_model and re-exported here, where callers have always found them.
__all__ = ["DEFAULT_FILE", "ENV_VAR", "EXAMPLE", "HEAD", "LAST_USED_FILE", "WORKER", "Host", "Inventory", "InventoryError",
           "find_inventory", "load_inventory", "record_last_used"]

ENV_VAR = "SPARKCLUSTER_INVENTORY"
DEFAULT_FILE = "inventory.yml"
LAST_USED_FILE = "last-inventory"
EXAMPLE = "see the README's \"Quick start (real Sparks)\", or inventories/two-sparks.yml in a clone"


# ---- loading ---------------------------------------------------------------------------------------------
def load_inventory(path: str | os.PathLike[str], *, check_files: bool = True) -> Inventory:
    """Read and validate an inventory in either format. `check_files=False` skips checking that key and
    known_hosts files exist (for example inventories and tests)."""
    shown = os.fspath(path)
    src = Source(shown, Path(shown).absolute().parent, check_files)
    try:
        doc = _read(Path(shown), src)
        inventory = (load_ansible if is_ansible(doc) else load_native)(doc, src, Path(shown))
    except InventoryError as e:  # a problem the reader could not read past: reported with those found before it
        if not e.line or len(e.problems) > 1:  # no line to name, or already every problem found
            raise
        src.report(e)
    src.raise_problems()  # every problem of the file in one error, exit 2
    return inventory


def _read(file: Path, src: Source) -> SourceMap:
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise InventoryError(f"{src.shown}: no such file", f"check the path, or write one ({EXAMPLE})") from None
    except IsADirectoryError:
        raise InventoryError(f"{src.shown}: is a directory, not an inventory file",
                             f"name the YAML file itself, e.g. {Path(src.shown, DEFAULT_FILE)}") from None
    except OSError as e:
        raise InventoryError(f"{src.shown}: cannot read it: {e.strerror}", "check the file's permissions") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise src.error(data.count(b"\n", 0, e.start) + 1, "the file is not UTF-8 text", "save it as UTF-8") from None
    try:
        doc = yamlsource.load(text)
    except yamlsource.YamlError as e:
        raise src.error(e.line, f"invalid YAML: {e.problem}", e.fix) from None
    if doc is None:
        raise src.error(1, "the inventory is empty", f"list the hosts under `hosts:` ({EXAMPLE})")
    if not isinstance(doc, SourceMap):
        raise src.error(doc.line if isinstance(doc, SourceList) else 1,
                        f"the top level must be a mapping (name:, vars:, hosts:, ...), not {describe(doc)}", EXAMPLE)
    return doc


# ---- which inventory -------------------------------------------------------------------------------------
def find_inventory(explicit: str | None, *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
                   config_dir: Path | None = None, explicit_reason: str = "from -i") -> tuple[Path, str]:
    """The inventory to use and why: the one named (-i, or a command's INVENTORY argument: `explicit_reason` says
    which), then $SPARKCLUSTER_INVENTORY, then ./inventory.yml, then the last one used."""
    env = os.environ if env is None else env
    if explicit:
        return _given(explicit, explicit_reason, cwd)
    if env.get(ENV_VAR):
        return _given(env[ENV_VAR], f"from ${ENV_VAR}", cwd)
    local = (cwd or Path()) / DEFAULT_FILE
    if local.is_file():
        return local, f"./{DEFAULT_FILE}"
    record = (config_dir or _config_dir(env)) / LAST_USED_FILE
    recorded = _recorded(record)
    if recorded and recorded.is_file():
        return recorded, f"last used (recorded in {_tilde(record, env)})"
    gone = f"; the last one used, {recorded}, no longer exists" if recorded else ""
    raise InventoryError(f"no inventory: no -i, no ${ENV_VAR}, no ./{DEFAULT_FILE}{gone}",
                         f"pass one with `-i FILE`, set {ENV_VAR}=FILE, or create ./{DEFAULT_FILE} ({EXAMPLE}); "
                         "once bootstrap has succeeded with an inventory, later commands find it on their own")


def record_last_used(path: Path, config_dir: Path | None = None) -> None:
    """Remember `path` for later commands that name no inventory (written atomically: temp file + rename)."""
    import tempfile  # only here, after a bootstrap: not among every command's start-up imports

    directory = config_dir or _config_dir(os.environ)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{LAST_USED_FILE}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(os.path.abspath(path) + "\n")
            os.replace(tmp, directory / LAST_USED_FILE)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        raise InventoryError(f"cannot record the inventory in {directory / LAST_USED_FILE}: {e.strerror}",
                             "make that directory writable, or set $XDG_CONFIG_HOME to one that is") from None


def _given(path: str, reason: str, cwd: Path | None) -> tuple[Path, str]:
    given = Path(path)
    found = given if cwd is None else cwd / given
    if not found.exists():
        raise InventoryError(f"{path} ({reason}): no such file", f"check the path, or write one ({EXAMPLE})")
    return found, reason


def _config_dir(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_CONFIG_HOME", "")
    # The XDG spec says a relative $XDG_CONFIG_HOME is invalid and must be ignored.
    base = Path(xdg) if os.path.isabs(xdg) else Path(env.get("HOME") or Path.home()) / ".config"
    return base / "sparkcluster"


def _recorded(record: Path) -> Path | None:
    try:
        text = record.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return Path(text) if os.path.isabs(text) else None


def _tilde(path: Path, env: Mapping[str, str]) -> str:
    try:
        return f"~/{path.relative_to(env.get('HOME') or Path.home())}"
    except ValueError:
        return str(path)
