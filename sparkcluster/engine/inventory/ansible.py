"""Ansible's YAML inventory, read as Ansible reads it so that one file can drive both tools.

Groups written in several places merge, `children:` nest, `spark-[1:4]` patterns expand, and group vars apply in
Ansible's (depth, name) order; `ansible_*` and `sparkcluster_*` vars map onto Host fields.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..yamlsource import SourceMap, describe
from .model import HEAD, WORKER, Inventory, InventoryError, Source
from .native import TOP_KEYS
from .values import (
    Draft,
    Layer,
    Value,
    build_draft,
    check_cluster,
    check_keys,
    check_name,
    inventory_name,
    mapping_at,
    merge_layers,
    model_ids,
    read_layer,
)

_ANSIBLE_GROUP_KEYS = ("hosts", "children", "vars")
_ANSIBLE_SETTINGS = {
    "ansible_host": "address", "ansible_user": "user", "ansible_port": "port", "ansible_ssh_private_key_file": "key",
    "ansible_become": "become", "sparkcluster_known_hosts": "known_hosts", "sparkcluster_role": "role",
    "qsfp_interface": "qsfp_interface", "fabric_ip": "fabric_ip", "hcas": "hcas",
}
_ANSIBLE_SECRETS = ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password", "ansible_become_password",
                    "ansible_become_pass", "ansible_sudo_pass")
_HEAD_GROUPS = ("head", "heads")
_MAX_RANGE_HOSTS = 1000
_RANGE = re.compile(r"\[([0-9]{1,6}):([0-9]{1,6})(?::([0-9]{1,6}))?\]")  # Ansible's `spark-[1:4]` host patterns


def is_ansible(doc: SourceMap) -> bool:
    """`all:` at the top, or nothing but group-shaped mappings (Ansible lets the top level list groups directly)."""
    if "all" in doc:
        return True
    return bool(doc) and not any(k in TOP_KEYS for k in doc) and all(
        isinstance(body, SourceMap) and body and all(k in _ANSIBLE_GROUP_KEYS for k in body) for body in doc.values())


@dataclass
class _AnsibleGroup:
    line: int
    vars: list[SourceMap] = field(default_factory=list)  # one per place the group is written, in file order
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)


class _AnsibleReader:
    """Collects groups and hosts the way Ansible does: a name written in several places is one group or host."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.groups: dict[str, _AnsibleGroup] = {}
        self.host_vars: dict[str, list[SourceMap]] = {}
        self.host_lines: dict[str, int] = {}

    def read(self, doc: SourceMap) -> None:
        self.group("all", doc.key_line("all") if "all" in doc else doc.line, doc.get("all"))
        for name, body in doc.items():
            if name != "all":
                self.group(name, doc.key_line(name), body)
                self.groups["all"].children.append(name)

    def group(self, name: Any, line: int, body: Any) -> None:
        check_name(name, line, "group", self.src)
        group = self.groups.setdefault(name, _AnsibleGroup(line))
        if body is None:
            return
        if not isinstance(body, SourceMap):
            raise self.src.error(line, f"group {name!r} must be a mapping with hosts:, children: or vars:, not {describe(body)}",
                                 f"e.g.\n  {name}:\n    hosts:\n      spark-1:\n        ansible_host: 192.168.1.50")
        check_keys(body, _ANSIBLE_GROUP_KEYS, self.src, f"in group {name!r}")
        group.vars.append(mapping_at(body, "vars", self.src))
        hosts = mapping_at(body, "hosts", self.src)
        for pattern, host_vars in hosts.items():
            self.hosts(group, pattern, hosts.key_line(pattern), host_vars)
        children = mapping_at(body, "children", self.src)
        for child, child_body in children.items():
            self.group(child, children.key_line(child), child_body)
            group.children.append(child)

    def hosts(self, group: _AnsibleGroup, pattern: Any, line: int, host_vars: Any) -> None:
        if not isinstance(host_vars, SourceMap | None):
            raise self.src.error(line, f"the vars of host {pattern!r} must be a mapping, not {describe(host_vars)}",
                                 f"e.g.\n  {pattern}:\n    ansible_host: 192.168.1.50")
        for name in _expand_range(pattern, line, self.src):
            check_name(name, line, "host", self.src)
            self.host_vars.setdefault(name, []).append(host_vars or SourceMap(line))
            self.host_lines.setdefault(name, line)
            group.hosts.append(name)

    def depths(self) -> dict[str, int]:
        """Each group's longest distance from `all`: Ansible applies group vars in (depth, name) order."""
        depths: dict[str, int] = {}

        def visit(name: str, depth: int, path: tuple[str, ...]) -> None:
            if name in path:
                cycle = " > ".join((*path[path.index(name):], name))
                raise self.src.error(self.groups[name].line, f"groups contain each other: {cycle}", "remove one of the `children:` entries")
            if depths.get(name, -1) >= depth:
                return
            depths[name] = depth
            for child in self.groups[name].children:
                visit(child, depth + 1, (*path, name))

        visit("all", 0, ())
        return depths

    def groups_of(self, host: str, depths: dict[str, int]) -> list[str]:
        """The host's groups and their ancestors, except `all`, in precedence order (lowest first)."""
        parents: dict[str, set[str]] = {}
        for name, group in self.groups.items():
            for child in group.children:
                parents.setdefault(child, set()).add(name)
        found: set[str] = set()
        todo = [name for name, group in self.groups.items() if host in group.hosts]
        while todo:
            name = todo.pop()
            if name not in found:
                found.add(name)
                todo.extend(parents.get(name, ()))
        return sorted(found - {"all"}, key=lambda g: (depths[g], g))


def load_ansible(doc: SourceMap, src: Source, path: Path) -> Inventory:
    reader = _AnsibleReader(src)
    reader.read(doc)
    depths = reader.depths()
    if not reader.host_vars:
        raise src.error(doc.line, "the inventory lists no hosts", "add hosts under `all:` > `hosts:` or under a group's `hosts:`")
    clash = next((g for g in reader.groups if g in reader.host_vars), None)
    if clash:
        raise src.error(reader.groups[clash].line, f"{clash!r} is both a group and a host", "rename the group or the host")
    group_layers = {name: merge_layers(read_layer(m, src, _ansible_key) for m in g.vars) for name, g in reader.groups.items()}
    # Inventory-wide settings live in all's vars under our prefix; popped so that hosts do not inherit them.
    all_vars, all_free = reader.groups["all"].vars, group_layers["all"][1]
    name, models = all_free.pop("sparkcluster_name", None), all_free.pop("sparkcluster_models", None)
    drafts = []
    for host in reader.host_vars:  # each host on its own: one run reports the problems of all of them
        try:
            drafts.append(_ansible_host(host, reader, depths, group_layers, src))
        except InventoryError as e:
            src.report(e)
    if len(drafts) == len(reader.host_vars):  # one head, no shared address: needs every host read
        check_cluster(drafts, src, doc.line, "put the head in a group named `head` under `children:`, or give it `sparkcluster_role: head`")
    try:
        title = inventory_name(name, _last_line(all_vars, "sparkcluster_name"), src, path)
        model_list = model_ids(models, _last_line(all_vars, "sparkcluster_models"), "sparkcluster_models", src)
    except InventoryError as e:
        src.report(e)
    src.raise_problems()
    return Inventory(path=path, name=title, hosts=tuple(d.host for d in drafts), vars=all_free, format="ansible",
                     models=model_list)


def _last_line(maps: list[SourceMap], key: str) -> int:
    return next((m.key_line(key) for m in reversed(maps) if key in m), 1)


def _ansible_host(host: str, reader: _AnsibleReader, depths: dict[str, int], group_layers: dict[str, Layer], src: Source) -> Draft:
    line = reader.host_lines[host]
    groups = reader.groups_of(host, depths)
    host_layers = [read_layer(m, src, _ansible_key) for m in reader.host_vars[host]]
    merged, free = merge_layers([group_layers["all"], *(group_layers[g] for g in groups), *host_layers])
    merged.setdefault("address", Value(host, "ansible_host", line))
    head_group = next((g for g in _HEAD_GROUPS if g in groups), None)
    merged.setdefault("role", Value(HEAD if head_group else WORKER, f"group {head_group}", line))
    return build_draft(host, merged, free, tuple(groups), src)


def _ansible_key(key: str, line: int, src: Source) -> str | None:
    if key in _ANSIBLE_SECRETS:
        raise src.error(line, f"{key}: sparkcluster takes no passwords from the inventory",
                        "use key-based SSH (ansible_ssh_private_key_file); give a sudo password with --ask-become-pass")
    return _ANSIBLE_SETTINGS.get(key)


def _expand_range(pattern: Any, line: int, src: Source) -> list[Any]:
    """`spark-[01:04]` -> spark-01 ... spark-04, as Ansible expands it (numeric ranges, leading zeros kept)."""
    if not isinstance(pattern, str) or not _RANGE.search(pattern):
        return [pattern]
    pieces = _RANGE.split(pattern)  # text, start, end, step, text, ...
    ranges = [_numbers(*pieces[i:i + 3]) for i in range(1, len(pieces), 4)]
    if not 0 < math.prod(len(r) for r in ranges) <= _MAX_RANGE_HOSTS:
        raise src.error(line, f"the host pattern {pattern!r} expands to no host or more than {_MAX_RANGE_HOSTS}",
                        "write ranges as [FIRST:LAST] or [FIRST:LAST:STEP] with FIRST <= LAST, e.g. spark-[1:4]")
    texts = pieces[0::4]
    return ["".join(t + n for t, n in zip(texts, (*combo, ""))) for combo in itertools.product(*ranges)]


def _numbers(start: str, end: str, step: str | None) -> list[str]:
    width = len(start) if start.startswith("0") and len(start) > 1 else 0
    stride = int(step or 1)
    return [f"{n:0{width}d}" for n in range(int(start), int(end) + 1, stride)] if stride > 0 else []

