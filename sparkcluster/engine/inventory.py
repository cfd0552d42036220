"""Inventories: the hosts of a cluster, loaded and validated before any connection is made.

Two formats become the same `Inventory`: sparkcluster's own (name, vars, groups, hosts, models) and
Ansible's YAML inventory, read as is so one file can drive both tools. Every problem is an InventoryError
that starts with `file:line:` and carries a fix (DESIGN.md §5).
"""

from __future__ import annotations

import ipaddress
import itertools
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import yamlsource
from .errors import UsageError, did_you_mean
from .modelref import ModelRef
from .yamlsource import SourceList, SourceMap

HEAD, WORKER = "head", "worker"
ENV_VAR = "SPARKCLUSTER_INVENTORY"
DEFAULT_FILE = "inventory.yml"
LAST_USED_FILE = "last-inventory"
EXAMPLE = "see inventories/two-sparks.yml"


class InventoryError(UsageError):
    """An inventory that is missing or invalid (exit 2); `line` is set when the message points into the file."""

    def __init__(self, message: str, fix: str = "", *, line: int | None = None) -> None:
        super().__init__(message, fix)
        self.line = line


@dataclass(frozen=True)
class Host:
    name: str  # inventory name, used in all output
    address: str  # what we connect to: an IP literal or a DNS/ssh-config host name
    role: str  # HEAD or WORKER
    user: str | None = None  # None: ~/.ssh/config or the local user decides
    port: int = 22
    key: str | None = None  # absolute path of the private key
    known_hosts: str | None = None  # absolute path of an extra known_hosts file
    become: bool = True
    qsfp_interface: str | None = None
    fabric_ip: str | None = None
    hcas: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()  # in precedence order, lowest first
    # Merged free-form vars (all < groups < host). Left out of the hash so hosts can be set members and dict keys.
    vars: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Inventory:
    path: Path  # as the user gave it
    name: str
    hosts: tuple[Host, ...]
    vars: Mapping[str, Any] = field(hash=False)  # the free-form vars every host starts from
    models: tuple[str, ...] = ()
    format: str = "sparkcluster"  # or "ansible"

    @property
    def head(self) -> Host:
        return next(h for h in self.hosts if h.role == HEAD)

    @property
    def workers(self) -> tuple[Host, ...]:
        return tuple(h for h in self.hosts if h.role != HEAD)

    def limit(self, names: Sequence[str]) -> Inventory:
        """Only the named hosts and the members of the named groups (`all` is every host); the head must stay."""
        selected: set[str] = set()
        for name in names:
            members = {h.name for h in self.hosts if name in (h.name, "all", *h.groups)}
            if not members:
                choices = sorted({h.name for h in self.hosts} | {g for h in self.hosts for g in h.groups})
                raise InventoryError(f"{self.path}: no host or group named {name!r}{did_you_mean(name, choices)}",
                                     f"choose from: {', '.join(choices)}")
            selected |= members
        if self.head.name not in selected:
            raise InventoryError(f"{self.path}: the selection {', '.join(names) or '(empty)'} leaves out the head {self.head.name}",
                                 f"include it as well ({', '.join([self.head.name, *names])}): every command needs the head")
        return replace(self, hosts=tuple(h for h in self.hosts if h.name in selected))


# ---- loading ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Source:
    shown: str  # the path as the user gave it
    dir: Path  # where relative key paths start
    check_files: bool

    def error(self, line: int, problem: str, fix: str) -> InventoryError:
        return InventoryError(f"{self.shown}:{line}: {problem}", fix, line=line)


@dataclass(frozen=True)
class _Value:
    """A setting as written: its value, the key it was written under (`port`, `ansible_port`) and its line."""

    value: Any
    key: str
    line: int


Layer = tuple[dict[str, _Value], dict[str, Any]]  # (settings by their Host field name, free-form vars)


def load_inventory(path: str | os.PathLike[str], *, check_files: bool = True) -> Inventory:
    """Read and validate an inventory in either format. `check_files=False` skips checking that key and
    known_hosts files exist (for example inventories and tests)."""
    shown = os.fspath(path)
    src = _Source(shown, Path(shown).absolute().parent, check_files)
    doc = _read(Path(shown), src)
    return (_load_ansible if _is_ansible(doc) else _load_own)(doc, src, Path(shown))


def _read(file: Path, src: _Source) -> SourceMap:
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
                        f"the top level must be a mapping (name:, vars:, hosts:, ...), not {_shown(doc)}", EXAMPLE)
    return doc


# ---- sparkcluster's own format ---------------------------------------------------------------------------
_TOP_KEYS = ("name", "vars", "groups", "hosts", "models")
_HOST_KEYS = ("address", "role", "user", "port", "key", "known_hosts", "become", "qsfp_interface", "fabric_ip", "hcas", "vars")
_GROUP_KEYS = ("hosts", "vars")
_PER_HOST = ("address", "role", "fabric_ip")  # the rest of _HOST_KEYS may also be set for all hosts or a group
_HOSTS_EXAMPLE = "e.g.\n  hosts:\n    spark-1: {address: 192.168.1.50, role: head}\n    spark-2: {address: 192.168.1.51}"


@dataclass(frozen=True)
class _Group:
    name: str
    members: tuple[str, ...]
    layer: Layer


def _load_own(doc: SourceMap, src: _Source, path: Path) -> Inventory:
    _check_keys(doc, _TOP_KEYS, src, "at the top level")
    hosts = doc.get("hosts")
    if not isinstance(hosts, SourceMap) or not hosts:
        problem = ("no `hosts:` section" if "hosts" not in doc else "`hosts` is empty" if not hosts
                   else f"`hosts` must map host names to settings, not {_shown(hosts)}")
        raise src.error(doc.key_line("hosts") if "hosts" in doc else doc.line, problem, _HOSTS_EXAMPLE)
    all_layer = _layer(_mapping(doc, "vars", src), src, _shared_key)
    groups = _own_groups(_mapping(doc, "groups", src), hosts, src)
    drafts = []
    for name, settings in hosts.items():
        member_of = [g for g in groups if name in g.members]
        layers = [all_layer, *(g.layer for g in member_of)]
        drafts.append(_own_host(name, hosts.key_line(name), settings, layers, tuple(g.name for g in member_of), src))
    _check_cluster(drafts, src, doc.key_line("hosts"), "give the host that runs the Ray head and the API server `role: head`")
    return Inventory(path=path, name=_name(doc.get("name"), doc.key_line("name") if "name" in doc else 1, src, path),
                     hosts=tuple(d.host for d in drafts), vars=all_layer[1], format="sparkcluster",
                     models=_models(doc.get("models"), doc.key_line("models") if "models" in doc else 1, "models", src))


def _own_host(name: Any, line: int, settings: Any, shared: list[Layer], groups: tuple[str, ...], src: _Source) -> _Draft:
    _check_name(name, line, "host", src)
    if not isinstance(settings, SourceMap):
        raise src.error(line, f"host {name!r} must map settings such as `address:` to values, not {_shown(settings)}",
                        f"e.g. `{name}: {{address: 192.168.1.50, role: worker}}`")
    _check_keys(settings, _HOST_KEYS, src, f"in host {name!r}")
    direct = {k: _Value(v, k, settings.key_line(k)) for k, v in settings.items() if k != "vars"}
    host_vars = _layer(_mapping(settings, "vars", src), src, _host_var_key)
    merged, free = _merge([*shared, host_vars, (direct, {})])
    if "address" not in merged:
        raise src.error(line, f"host {name!r} has no address", f"add `address: <IP or DNS name>` under {name}")
    merged.setdefault("role", _Value(WORKER, "role", line))
    return _draft(name, merged, free, groups, src)


def _shared_key(key: str, line: int, src: _Source) -> str | None:
    if key in _PER_HOST:
        raise src.error(line, f"{key} cannot be shared by several hosts", f"set `{key}:` under each host")
    return key if key in _HOST_KEYS and key != "vars" else None


def _host_var_key(key: str, line: int, src: _Source) -> None:
    if key in _HOST_KEYS:
        raise src.error(line, f"{key} is a host setting, not a var", f"move `{key}:` out of `vars:`, directly under the host")


def _own_groups(groups: SourceMap, hosts: SourceMap, src: _Source) -> list[_Group]:
    result = []
    for name, body in groups.items():
        line = groups.key_line(name)
        _check_group_name(name, line, hosts, src)
        if name == "all":
            raise src.error(line, "the group name 'all' is reserved: it means every host", "use `vars:` at the top level for all hosts")
        if not isinstance(body, SourceMap | None):
            raise src.error(line, f"group {name!r} must be a mapping with `hosts:` and `vars:`, not {_shown(body)}",
                            f"e.g. `{name}: {{hosts: [spark-1, spark-2], vars: {{port: 22}}}}`")
        body = body or SourceMap(line)
        _check_keys(body, _GROUP_KEYS, src, f"in group {name!r}")
        members = _group_members(name, body, hosts, src)
        result.append(_Group(name, members, _layer(_mapping(body, "vars", src), src, _shared_key)))
    return result


def _group_members(group: str, body: SourceMap, hosts: SourceMap, src: _Source) -> tuple[str, ...]:
    members = body.get("hosts")
    if members is None:
        return ()
    if not isinstance(members, SourceList):
        raise src.error(body.key_line("hosts"), f"the hosts of group {group!r} must be a list of host names, not {_shown(members)}",
                        "e.g. `hosts: [spark-1, spark-2]`")
    for i, member in enumerate(members):
        if not isinstance(member, str) or member not in hosts:
            names = [h for h in hosts if isinstance(h, str)]
            raise src.error(members.item_line(i), f"group {group!r} lists {member!r}, which is not under `hosts:`"
                            f"{did_you_mean(member, names)}", f"list only hosts defined under `hosts:` ({', '.join(names)})")
    return tuple(dict.fromkeys(members))


# ---- Ansible's YAML inventory ----------------------------------------------------------------------------
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


def _is_ansible(doc: SourceMap) -> bool:
    """`all:` at the top, or nothing but group-shaped mappings (Ansible lets the top level list groups directly)."""
    if "all" in doc:
        return True
    return bool(doc) and not any(k in _TOP_KEYS for k in doc) and all(
        isinstance(body, SourceMap) and body and all(k in _ANSIBLE_GROUP_KEYS for k in body) for body in doc.values())


@dataclass
class _AnsibleGroup:
    line: int
    vars: list[SourceMap] = field(default_factory=list)  # one per place the group is written, in file order
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)


class _AnsibleReader:
    """Collects groups and hosts the way Ansible does: a name written in several places is one group or host."""

    def __init__(self, src: _Source) -> None:
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
        _check_name(name, line, "group", self.src)
        group = self.groups.setdefault(name, _AnsibleGroup(line))
        if body is None:
            return
        if not isinstance(body, SourceMap):
            raise self.src.error(line, f"group {name!r} must be a mapping with hosts:, children: or vars:, not {_shown(body)}",
                                 f"e.g.\n  {name}:\n    hosts:\n      spark-1:\n        ansible_host: 192.168.1.50")
        _check_keys(body, _ANSIBLE_GROUP_KEYS, self.src, f"in group {name!r}")
        group.vars.append(_mapping(body, "vars", self.src))
        hosts = _mapping(body, "hosts", self.src)
        for pattern, host_vars in hosts.items():
            self.hosts(group, pattern, hosts.key_line(pattern), host_vars)
        children = _mapping(body, "children", self.src)
        for child, child_body in children.items():
            self.group(child, children.key_line(child), child_body)
            group.children.append(child)

    def hosts(self, group: _AnsibleGroup, pattern: Any, line: int, host_vars: Any) -> None:
        if not isinstance(host_vars, SourceMap | None):
            raise self.src.error(line, f"the vars of host {pattern!r} must be a mapping, not {_shown(host_vars)}",
                                 f"e.g.\n  {pattern}:\n    ansible_host: 192.168.1.50")
        for name in _expand_range(pattern, line, self.src):
            _check_name(name, line, "host", self.src)
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


def _load_ansible(doc: SourceMap, src: _Source, path: Path) -> Inventory:
    reader = _AnsibleReader(src)
    reader.read(doc)
    depths = reader.depths()
    if not reader.host_vars:
        raise src.error(doc.line, "the inventory lists no hosts", "add hosts under `all:` > `hosts:` or under a group's `hosts:`")
    clash = next((g for g in reader.groups if g in reader.host_vars), None)
    if clash:
        raise src.error(reader.groups[clash].line, f"{clash!r} is both a group and a host", "rename the group or the host")
    group_layers = {name: _merge(_layer(m, src, _ansible_key) for m in g.vars) for name, g in reader.groups.items()}
    # Inventory-wide settings live in all's vars under our prefix; popped so that hosts do not inherit them.
    all_vars, all_free = reader.groups["all"].vars, group_layers["all"][1]
    name, models = all_free.pop("sparkcluster_name", None), all_free.pop("sparkcluster_models", None)
    drafts = [_ansible_host(host, reader, depths, group_layers, src) for host in reader.host_vars]
    _check_cluster(drafts, src, doc.line, "put the head in a group named `head` under `children:`, or give it `sparkcluster_role: head`")
    return Inventory(path=path, name=_name(name, _last_line(all_vars, "sparkcluster_name"), src, path),
                     hosts=tuple(d.host for d in drafts), vars=all_free, format="ansible",
                     models=_models(models, _last_line(all_vars, "sparkcluster_models"), "sparkcluster_models", src))


def _last_line(maps: list[SourceMap], key: str) -> int:
    return next((m.key_line(key) for m in reversed(maps) if key in m), 1)


def _ansible_host(host: str, reader: _AnsibleReader, depths: dict[str, int], group_layers: dict[str, Layer], src: _Source) -> _Draft:
    line = reader.host_lines[host]
    groups = reader.groups_of(host, depths)
    host_layers = [_layer(m, src, _ansible_key) for m in reader.host_vars[host]]
    merged, free = _merge([group_layers["all"], *(group_layers[g] for g in groups), *host_layers])
    merged.setdefault("address", _Value(host, "ansible_host", line))
    head_group = next((g for g in _HEAD_GROUPS if g in groups), None)
    merged.setdefault("role", _Value(HEAD if head_group else WORKER, f"group {head_group}", line))
    return _draft(host, merged, free, tuple(groups), src)


def _ansible_key(key: str, line: int, src: _Source) -> str | None:
    if key in _ANSIBLE_SECRETS:
        raise src.error(line, f"{key}: sparkcluster takes no passwords from the inventory",
                        "use key-based SSH (ansible_ssh_private_key_file); give a sudo password with --ask-become-pass")
    return _ANSIBLE_SETTINGS.get(key)


def _expand_range(pattern: Any, line: int, src: _Source) -> list[Any]:
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


# ---- shared by both formats ------------------------------------------------------------------------------
Classify = Callable[[str, int, _Source], "str | None"]  # a var's Host field name, None if free-form; raises if forbidden


@dataclass(frozen=True)
class _Draft:
    host: Host
    lines: dict[str, int]  # Host field -> the line it was set on, for errors that compare hosts


def _layer(values: SourceMap, src: _Source, classify: Classify) -> Layer:
    settings: dict[str, _Value] = {}
    free: dict[str, Any] = {}
    for key, value in values.items():
        line = values.key_line(key)
        if not isinstance(key, str):
            raise src.error(line, f"the var name {key!r} is not a string", "name vars with letters, digits and '_'")
        setting = classify(key, line, src)
        if setting:
            settings[setting] = _Value(value, key, line)
        else:
            free[key] = value
    return settings, free


def _merge(layers: Iterable[Layer]) -> Layer:
    settings: dict[str, _Value] = {}
    free: dict[str, Any] = {}
    for layer_settings, layer_free in layers:
        settings.update(layer_settings)
        free.update(layer_free)
    return settings, free


def _draft(name: str, settings: dict[str, _Value], free: dict[str, Any], groups: tuple[str, ...], src: _Source) -> _Draft:
    fields = {setting: _VALIDATORS[setting](value, src) for setting, value in settings.items()}
    return _Draft(Host(name=name, groups=groups, vars=free, **fields), {s: v.line for s, v in settings.items()})


def _check_cluster(drafts: list[_Draft], src: _Source, hosts_line: int, no_head_fix: str) -> None:
    heads = [d for d in drafts if d.host.role == HEAD]
    if not heads:
        raise src.error(hosts_line, "no host is the head", no_head_fix)
    if len(heads) > 1:
        raise src.error(heads[1].lines["role"], f"two heads: {heads[0].host.name} and {heads[1].host.name}",
                        "make exactly one host the head; the others are workers")
    _check_unique(drafts, src, "address", lambda h: (_address_identity(h.address), h.port),
                  "give each host its own address (or port), or remove the duplicate host")
    _check_unique(drafts, src, "fabric_ip", lambda h: h.fabric_ip, "each host's QSFP interface needs its own IPv4 address")


def _check_unique(drafts: list[_Draft], src: _Source, setting: str, identity: Callable[[Host], Any], fix: str) -> None:
    seen: dict[Any, Host] = {}
    for draft in drafts:
        key = identity(draft.host)
        if key in seen:
            other = seen[key]
            shown = getattr(draft.host, setting)
            raise src.error(draft.lines[setting], f"{draft.host.name} has the same {setting} as {other.name} ({shown})", fix)
        if getattr(draft.host, setting) is not None:
            seen[key] = draft.host


def _address_identity(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower()


def _check_keys(values: SourceMap, allowed: Sequence[str], src: _Source, where: str) -> None:
    for key in values:
        if key not in allowed:
            raise src.error(values.key_line(key), f"unknown key {key!r} {where}{did_you_mean(key, allowed)}",
                            f"allowed keys: {', '.join(allowed)}")


def _mapping(parent: SourceMap, key: str, src: _Source) -> SourceMap:
    """parent[key] as a mapping; empty where it is absent or left blank (`vars:` with everything commented out)."""
    value = parent.get(key)
    if value is None:
        return SourceMap(parent.line)
    if not isinstance(value, SourceMap):
        raise src.error(parent.key_line(key), f"`{key}` must be a mapping, not {_shown(value)}",
                        f"write `{key}:` followed by indented `name: value` lines")
    return value


def _check_name(name: Any, line: int, what: str, src: _Source) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise src.error(line, f"{name!r} is not a valid {what} name",
                        "use letters, digits, '_', '.', '-' (and ':' in IPv6 addresses), starting with a letter, digit or '_'")


def _check_group_name(name: Any, line: int, hosts: SourceMap, src: _Source) -> None:
    _check_name(name, line, "group", src)
    if name in hosts:
        raise src.error(line, f"{name!r} is both a group and a host", "rename the group or the host")


def _name(value: Any, line: int, src: _Source, path: Path) -> str:
    if value is None:
        return path.stem
    if isinstance(value, str) and value and value.isprintable():
        return value
    raise src.error(line, f"the inventory name must be one line of text, not {_shown(value)}", "e.g. `name: lab`")


def _models(value: Any, line: int, key: str, src: _Source) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, SourceList):
        raise src.error(line, f"{key} must be a list of Hugging Face repo ids, not {_shown(value)}", f"e.g. `{key}: [Qwen/Qwen3-0.6B]`")
    for i, model in enumerate(value):
        if not isinstance(model, str) or not _is_model(model):
            raise src.error(value.item_line(i), f"{key}: {_shown(model)} is not a Hugging Face repo id",
                            "write ORG/NAME or ORG/NAME@REVISION, e.g. Qwen/Qwen3-0.6B")
    return tuple(value)


def _shown(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, dict | list):
        return "a mapping" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- values ----------------------------------------------------------------------------------------------
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}")
_USER = re.compile(r"[a-z_][a-z0-9_-]*[$]?")
_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_IFNAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,14}")
_HCA = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def _address(v: _Value, src: _Source) -> str:
    if isinstance(v.value, str) and (_is_ip(v.value) or _is_hostname(v.value)):
        return v.value
    raise src.error(v.line, f"{v.key} {_shown(v.value)} is not an IP address or host name",
                    "use an IPv4/IPv6 address or a DNS or ~/.ssh/config host name (letters, digits, '.', '-', '_')")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_hostname(text: str) -> bool:
    labels = text.split(".")
    # All-numeric labels would be read as a (bad) IPv4 address by ssh, e.g. 192.168.1.300.
    return len(text) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels) and not all(label.isdigit() for label in labels)


def _role(v: _Value, src: _Source) -> str:
    if isinstance(v.value, str) and v.value in (HEAD, WORKER):
        return v.value
    raise src.error(v.line, f"{v.key} must be 'head' or 'worker', not {_shown(v.value)}",
                    "one host is the head (Ray head and API server); the others are workers")


def _user(v: _Value, src: _Source) -> str:
    if isinstance(v.value, str) and len(v.value) <= 32 and _USER.fullmatch(v.value):
        return v.value
    raise src.error(v.line, f"{v.key} {_shown(v.value)} is not a valid user name",
                    "a Linux user name: up to 32 lowercase letters, digits, '_' or '-', starting with a letter or '_'")


def _port(v: _Value, src: _Source) -> int:
    value = v.value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
        return value
    raise src.error(v.line, f"{v.key} must be a port number from 1 to 65535, not {_shown(v.value)}", f"e.g. `{v.key}: 22`")


def _become(v: _Value, src: _Source) -> bool:
    if isinstance(v.value, bool):
        return v.value
    raise src.error(v.line, f"{v.key} must be true or false, not {_shown(v.value)}", f"e.g. `{v.key}: true`")


def _file(v: _Value, src: _Source, fix: str) -> str:
    if not isinstance(v.value, str) or not v.value or not v.value.isprintable():
        raise src.error(v.line, f"{v.key} must be a file path, not {_shown(v.value)}", fix)
    path = os.path.normpath(src.dir / os.path.expanduser(v.value))
    if src.check_files and not os.path.isfile(path):
        raise src.error(v.line, f"{v.key}: {path} does not exist", fix)
    return path


def _key_file(v: _Value, src: _Source) -> str:
    return _file(v, src, "create a key with `ssh-keygen -t ed25519` and install it with `ssh-copy-id`, or correct the path "
                         "(a relative path starts at the inventory's directory)")


def _known_hosts_file(v: _Value, src: _Source) -> str:
    return _file(v, src, "write it with `ssh-keyscan HOST >> FILE` after checking the fingerprints, or correct the path "
                         "(a relative path starts at the inventory's directory)")


def _interface(v: _Value, src: _Source) -> str:
    if isinstance(v.value, str) and _IFNAME.fullmatch(v.value) and v.value not in (".", ".."):
        return v.value
    raise src.error(v.line, f"{v.key} {_shown(v.value)} is not a network interface name",
                    "Linux interface names are 1-15 letters, digits, '_', '.' or '-', e.g. enp1s0f1np1 (`ip -br link` lists them)")


def _fabric_ip(v: _Value, src: _Source) -> str:
    try:
        ip = ipaddress.IPv4Address(v.value) if isinstance(v.value, str) else None
    except ValueError:
        ip = None
    if ip is None or ip.is_loopback or ip.is_unspecified or ip.is_multicast:
        raise src.error(v.line, f"{v.key} {_shown(v.value)} is not a usable IPv4 address",
                        "the IPv4 address of the host's QSFP interface, e.g. 192.168.177.11; leave it out to detect it")
    return str(ip)


def _hcas(v: _Value, src: _Source) -> tuple[str, ...]:
    if isinstance(v.value, str):
        items = [(name.strip(), v.line) for name in v.value.split(",")]
    elif isinstance(v.value, SourceList):
        items = [(name, v.value.item_line(i)) for i, name in enumerate(v.value)]
    else:
        raise src.error(v.line, f"{v.key} must be a list of RDMA device names, not {_shown(v.value)}",
                        f"e.g. `{v.key}: [rocep1s0f1, roceP2p1s0f1]`")
    for name, line in items:
        if not isinstance(name, str) or not _HCA.fullmatch(name):
            raise src.error(line, f"{v.key}: {_shown(name)} is not an RDMA device name",
                            "use the names `ibdev2netdev` shows, e.g. rocep1s0f1")
    return tuple(name for name, _ in items)


def _is_model(text: str) -> bool:
    """The same rule `sparkcluster stage` applies, so bootstrap never provisions toward a model it then rejects."""
    try:
        ModelRef.parse(text)
    except UsageError:
        return False
    return True


_VALIDATORS: dict[str, Callable[[_Value, _Source], Any]] = {
    "address": _address, "role": _role, "user": _user, "port": _port, "key": _key_file, "known_hosts": _known_hosts_file,
    "become": _become, "qsfp_interface": _interface, "fabric_ip": _fabric_ip, "hcas": _hcas,
}


# ---- which inventory -------------------------------------------------------------------------------------
def find_inventory(explicit: str | None, *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
                   config_dir: Path | None = None) -> tuple[Path, str]:
    """The inventory to use and why: -i, then $SPARKCLUSTER_INVENTORY, then ./inventory.yml, then the last one used."""
    env = os.environ if env is None else env
    if explicit:
        return _given(explicit, "from -i", cwd)
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
                         "once a command has used an inventory, later commands find it on their own")


def record_last_used(path: Path, config_dir: Path | None = None) -> None:
    """Remember `path` for later commands that name no inventory (written atomically: temp file + rename)."""
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
