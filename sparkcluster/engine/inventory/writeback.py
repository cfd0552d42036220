"""Setting one var for every host in the user's own inventory file, leaving the rest of it as written.

A choice made once on the command line (`bootstrap --runtime host`) belongs in the inventory, where every later
command reads it and the user sees and can change it. Re-dumping the YAML would drop the user's comments, quoting
and order, so the file is edited in place: PyYAML composes it into nodes that know where they start and end, and
only the value's own characters change, or one line is added. The result is loaded as an inventory again, and
must give every host the value, before it replaces the file (atomically, with the file's mode).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from .model import Inventory, InventoryError

_PLAIN = re.compile(r"[A-Za-z0-9_./~-]+")
_BOM = "\ufeff"


def set_shared_var(inventory: Inventory, key: str, value: str) -> bool:
    """Sets `key: value` in the vars every host starts from (`vars:`, or Ansible's `all: vars:`) of the file
    `inventory` was loaded from. False when the file already says so, True when it was rewritten; an
    InventoryError, with what to write by hand, when the file cannot take it."""
    from . import load_inventory  # the package imports this module's callers, not this module

    if all(h.vars.get(key) == value for h in inventory.hosts) and inventory.vars.get(key) == value:
        return False
    path = Path(os.path.realpath(inventory.path))  # a linked inventory: its target changes, the link stays
    by_hand = f"add `{key}: {value}` under the inventory's {'all: vars:' if inventory.format == 'ansible' else 'vars:'}"
    try:
        raw_bytes = path.read_bytes()
        raw = raw_bytes.decode("utf-8")
        _check_replaceable(str(inventory.path), path, by_hand)
    except (OSError, UnicodeDecodeError) as e:
        raise InventoryError(f"{inventory.path}: cannot read it to record {key}: {e}", by_hand) from None
    bom = _BOM if raw.startswith(_BOM) else ""
    text = edited(raw[len(bom):], ("all", "vars") if inventory.format == "ansible" else ("vars",), key, value)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".yml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(bom + text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        if os.geteuid() == 0:  # root (sudo) editing a user's file leaves it theirs
            os.chown(tmp, path.stat().st_uid, path.stat().st_gid)
        try:
            after = load_inventory(tmp, check_files=False)
        except InventoryError as e:
            raise InventoryError(f"{inventory.path}: recording `{key}: {value}` would make it invalid "
                                 f"({e.message.replace(tmp, 'the edited file')})", by_hand) from None
        shadowed = [h.name for h in after.hosts if h.vars.get(key) != value]
        if shadowed:
            raise InventoryError(f"{inventory.path}: {', '.join(shadowed)} set{'s' if len(shadowed) == 1 else ''} "
                                 f"`{key}` in {'its' if len(shadowed) == 1 else 'their'} own or a group's vars, "
                                 f"over the shared `{key}: {value}`",
                                 f"remove `{key}` there: one cluster has one {key}")
        if path.read_bytes() != raw_bytes:  # saved by someone else meanwhile: their edit is not ours to drop
            raise InventoryError(f"{inventory.path}: changed while {key} was being recorded in it; left as it now is",
                                 f"run the command again, or {by_hand}")
        os.replace(tmp, path)
    except OSError as e:
        raise InventoryError(f"{inventory.path}: cannot write it to record {key}: {e.strerror or e}", by_hand) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return True


def _check_replaceable(shown: str, path: Path, by_hand: str) -> None:
    """A file the edit would wrong by replacing it: one its owner made read-only (root too respects that), and one
    with other names (hard links), which would go on holding the old text."""
    st = path.stat()
    if not st.st_mode & 0o222 or not os.access(path, os.W_OK):
        raise InventoryError(f"{shown}: is read-only, so it is left as it is",
                             f"make it writable (`chmod u+w {shown}`) and run the command again, or {by_hand}")
    if st.st_nlink > 1:
        raise InventoryError(f"{shown}: has {st.st_nlink} names (hard links); a new file in its place would leave "
                             "the others with the old text", by_hand)


def edited(text: str, at: tuple[str, ...], key: str, value: str) -> str:
    """`text` with `key: value` in the mapping at the path `at` (made where missing): the value's characters
    replaced where the key is written, else one entry added before the mapping's first."""
    root = yaml.compose(text)
    scalar = value if _PLAIN.fullmatch(value) and yaml.safe_load(value) == value else json.dumps(value)
    newline = "\r\n" if "\r\n" in text else "\n"
    if not isinstance(root, MappingNode):
        raise InventoryError("the inventory's top level is not a mapping", "see inventories/two-sparks.yml")
    node: MappingNode = root
    wanted = (*at, key)
    for depth, name in enumerate(wanted):
        found = _entry(node, name)
        rest = wanted[depth:]
        if found is None:
            return _insert(text, node, rest, scalar, newline)
        key_node, child = found
        last = depth == len(wanted) - 1
        if last or (isinstance(child, ScalarNode) and child.tag.endswith(":null")):
            new = scalar if last else _flow(wanted[depth + 1:], scalar)
            if child.start_mark.index == child.end_mark.index:  # `vars:` with nothing after it
                colon = text.index(":", key_node.end_mark.index) + 1
                return text[:colon] + " " + new + text[colon:]
            if isinstance(child, ScalarNode) and child.style in ("|", ">"):  # a block scalar's span ends past
                old = text[child.start_mark.index:child.end_mark.index]     # its line breaks: they stay
                new += old[len(old.rstrip(" \t\r\n")):]
            return text[:child.start_mark.index] + new + text[child.end_mark.index:]
        if not isinstance(child, MappingNode):
            raise InventoryError(f"`{name}` (line {key_node.start_mark.line + 1}) is not a mapping",
                                 "make it one: `vars:` holds `key: value` lines")
        node = child
    raise AssertionError("unreachable: the loop returns at its last key")


def _entry(node: MappingNode, name: str) -> tuple[Node, Node] | None:
    for key_node, value_node in node.value:
        if isinstance(key_node, ScalarNode) and key_node.value == name and key_node.tag != "tag:yaml.org,2002:merge":
            return key_node, value_node
    return None


def _flow(keys: tuple[str, ...], scalar: str) -> str:
    """`{a: {b: VALUE}}` for keys (a, b)."""
    inner = scalar
    for name in reversed(keys):
        inner = f"{{{name}: {inner}}}"
    return inner


def _insert(text: str, node: MappingNode, keys: tuple[str, ...], scalar: str, newline: str) -> str:
    """`keys` (the first of them missing from `node`) added to `node` as its first entry, in its own style."""
    if node.flow_style or not node.value:
        if not node.value and not node.flow_style:  # an empty block mapping is only the root of an empty file
            return f"{_block(keys, scalar, 0, newline)}{text}"
        brace = node.start_mark.index + 1
        nested = _flow(keys, scalar)[1:-1]  # `a: {b: VALUE}` inside the braces
        return text[:brace] + nested + (", " if node.value else "") + text[brace:]
    first = node.value[0][0]
    line_start = first.start_mark.index - first.start_mark.column
    if text[line_start:first.start_mark.index].strip():  # the first key shares its line (`- a: 1`): no room above
        raise InventoryError(f"line {first.start_mark.line + 1}: the mapping starts on a line it shares",
                             "write its first key on a line of its own")
    return text[:line_start] + _block(keys, scalar, first.start_mark.column, newline) + text[line_start:]


def _block(keys: tuple[str, ...], scalar: str, indent: int, newline: str) -> str:
    lines = [" " * (indent + 2 * i) + f"{name}:" for i, name in enumerate(keys)]
    lines[-1] += f" {scalar}"
    return newline.join(lines) + newline
