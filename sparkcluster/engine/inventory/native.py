"""sparkcluster's own inventory format: top-level name, vars, groups, hosts and models.

Kept apart from the Ansible reader because the two formats group and layer settings differently; both hand
their settings to inventory_values to become Hosts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import did_you_mean
from ..yamlsource import SourceList, SourceMap, describe
from .model import WORKER, Inventory, InventoryError, Source
from .values import (
    Draft,
    Layer,
    Value,
    build_draft,
    check_cluster,
    check_group_name,
    check_keys,
    check_name,
    inventory_name,
    mapping_at,
    merge_layers,
    model_ids,
    read_layer,
)

TOP_KEYS = ("name", "vars", "groups", "hosts", "models")
_HOST_KEYS = ("address", "role", "user", "port", "key", "known_hosts", "become", "qsfp_interface", "fabric_ip", "hcas", "vars")
_GROUP_KEYS = ("hosts", "vars")
_PER_HOST = ("address", "role", "fabric_ip")  # the rest of _HOST_KEYS may also be set for all hosts or a group
_HOSTS_EXAMPLE = "e.g.\n  hosts:\n    spark-1: {address: 192.168.1.50, role: head}\n    spark-2: {address: 192.168.1.51}"


@dataclass(frozen=True)
class _Group:
    name: str
    members: tuple[str, ...]
    layer: Layer


def load_native(doc: SourceMap, src: Source, path: Path) -> Inventory:
    check_keys(doc, TOP_KEYS, src, "at the top level")
    hosts = doc.get("hosts")
    if not isinstance(hosts, SourceMap) or not hosts:
        problem = ("no `hosts:` section" if "hosts" not in doc else "`hosts` is empty" if not hosts
                   else f"`hosts` must map host names to settings, not {describe(hosts)}")
        raise src.error(doc.key_line("hosts") if "hosts" in doc else doc.line, problem, _HOSTS_EXAMPLE)
    all_layer = read_layer(mapping_at(doc, "vars", src), src, _shared_key)
    groups = _own_groups(mapping_at(doc, "groups", src), hosts, src)
    drafts = []
    for name, settings in hosts.items():  # each host on its own: one run reports the problems of all of them
        member_of = [g for g in groups if name in g.members]
        layers = [all_layer, *(g.layer for g in member_of)]
        try:
            drafts.append(_own_host(name, hosts.key_line(name), settings, layers, tuple(g.name for g in member_of), src))
        except InventoryError as e:
            src.report(e)
    if len(drafts) == len(hosts):  # the cluster's checks (one head, no shared address) need every host read
        check_cluster(drafts, src, doc.key_line("hosts"), "give the host that runs the Ray head and the API server `role: head`")
    try:
        title = inventory_name(doc.get("name"), doc.key_line("name") if "name" in doc else 1, src, path)
        models = model_ids(doc.get("models"), doc.key_line("models") if "models" in doc else 1, "models", src)
    except InventoryError as e:
        src.report(e)
    src.raise_problems()
    return Inventory(path=path, name=title, hosts=tuple(d.host for d in drafts), vars=all_layer[1],
                     format="sparkcluster", models=models)


def _own_host(name: Any, line: int, settings: Any, shared: list[Layer], groups: tuple[str, ...], src: Source) -> Draft:
    check_name(name, line, "host", src)
    if not isinstance(settings, SourceMap):
        raise src.error(line, f"host {name!r} must map settings such as `address:` to values, not {describe(settings)}",
                        f"e.g. `{name}: {{address: 192.168.1.50, role: worker}}`")
    check_keys(settings, _HOST_KEYS, src, f"in host {name!r}")
    direct = {k: Value(v, k, settings.key_line(k)) for k, v in settings.items() if k in _HOST_KEYS and k != "vars"}
    host_vars = read_layer(mapping_at(settings, "vars", src), src, _host_var_key)
    merged, free = merge_layers([*shared, host_vars, (direct, {})])
    if "address" not in merged:
        raise src.error(line, f"host {name!r} has no address", f"add `address: <IP or DNS name>` under {name}")
    merged.setdefault("role", Value(WORKER, "role", line))
    return build_draft(name, merged, free, groups, src)


def _shared_key(key: str, line: int, src: Source) -> str | None:
    if key in _PER_HOST:
        raise src.error(line, f"{key} cannot be shared by several hosts", f"set `{key}:` under each host")
    return key if key in _HOST_KEYS and key != "vars" else None


def _host_var_key(key: str, line: int, src: Source) -> None:
    if key in _HOST_KEYS:
        raise src.error(line, f"{key} is a host setting, not a var", f"move `{key}:` out of `vars:`, directly under the host")


def _own_groups(groups: SourceMap, hosts: SourceMap, src: Source) -> list[_Group]:
    result = []
    for name, body in groups.items():
        try:
            result.append(_own_group(name, body, groups.key_line(name), hosts, src))
        except InventoryError as e:
            src.report(e)
    return result


def _own_group(name: Any, body: Any, line: int, hosts: SourceMap, src: Source) -> _Group:
    check_group_name(name, line, hosts, src)
    if name == "all":
        raise src.error(line, "the group name 'all' is reserved: it means every host", "use `vars:` at the top level for all hosts")
    if not isinstance(body, SourceMap | None):
        raise src.error(line, f"group {name!r} must be a mapping with `hosts:` and `vars:`, not {describe(body)}",
                        f"e.g. `{name}: {{hosts: [spark-1, spark-2], vars: {{port: 22}}}}`")
    body = body or SourceMap(line)
    check_keys(body, _GROUP_KEYS, src, f"in group {name!r}")
    members = _group_members(name, body, hosts, src)
    return _Group(name, members, read_layer(mapping_at(body, "vars", src), src, _shared_key))


def _group_members(group: str, body: SourceMap, hosts: SourceMap, src: Source) -> tuple[str, ...]:
    members = body.get("hosts")
    if members is None:
        return ()
    if not isinstance(members, SourceList):
        raise src.error(body.key_line("hosts"), f"the hosts of group {group!r} must be a list of host names, not {describe(members)}",
                        "e.g. `hosts: [spark-1, spark-2]`")
    for i, member in enumerate(members):
        if not isinstance(member, str) or member not in hosts:
            names = [h for h in hosts if isinstance(h, str)]
            raise src.error(members.item_line(i), f"group {group!r} lists {member!r}, which is not under `hosts:`"
                            f"{did_you_mean(member, names)}", f"list only hosts defined under `hosts:` ({', '.join(names)})")
    return tuple(dict.fromkeys(members))

