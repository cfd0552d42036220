"""What both inventory formats share: settings as written (with their lines), layering them, and the checks
that turn them into a Host.

Both readers end in the same Host fields, so the validators live here once and the two formats cannot drift
apart in what they accept or in how their errors read.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..command import ENV_NAME
from ..errors import UsageError, did_you_mean
from ..modelref import ModelRef
from ..yamlsource import SourceList, SourceMap, describe
from .fabric import check_fabric
from .model import HEAD, WORKER, Host, InventoryError, Source


@dataclass(frozen=True)
class Value:
    """A setting as written: its value, the key it was written under (`port`, `ansible_port`) and its line."""

    value: Any
    key: str
    line: int


Layer = tuple[dict[str, Value], dict[str, Any]]  # (settings by their Host field name, free-form vars)
Classify = Callable[[str, int, Source], "str | None"]  # a var's Host field name, None if free-form; raises if forbidden


@dataclass(frozen=True)
class Draft:
    host: Host
    lines: dict[str, int]  # Host field -> the line it was set on, for errors that compare hosts


def read_layer(values: SourceMap, src: Source, classify: Classify) -> Layer:
    settings: dict[str, Value] = {}
    free: dict[str, Any] = {}
    for key, value in values.items():
        line = values.key_line(key)
        try:  # each var on its own: one run reports the problems of all of them
            if not isinstance(key, str):
                raise src.error(line, f"the var name {key!r} is not a string", "name vars with letters, digits and '_'")
            setting = classify(key, line, src)
            if setting:
                settings[setting] = Value(value, key, line)
            else:
                if key in HOST_VAR_CHECKS:
                    HOST_VAR_CHECKS[key](value, line, src)
                free[key] = value
        except InventoryError as e:
            src.report(e)
    return settings, free


def check_serve_env(value: Any, line: int, src: Source) -> None:
    """`serve_env` becomes `export NAME=value` on every node: a name the shell does not read as a name would run as
    a command there, so it is refused here, before any connection, where its line is still known."""
    if value is None:
        return
    if not isinstance(value, SourceMap):
        raise src.error(line, f"serve_env must map variable names to values, not {describe(value)}",
                        "e.g. `serve_env: {VLLM_LOGGING_LEVEL: INFO}`")
    for name, setting in value.items():
        at = value.key_line(name)
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise src.error(at, f"serve_env: {describe(name)} is not an environment variable name",
                            "use letters, digits and '_', not starting with a digit, e.g. VLLM_LOGGING_LEVEL")
        if setting is None or isinstance(setting, dict | list):
            raise src.error(at, f"serve_env: {name} must be one value, not {describe(setting)}",
                            f"e.g. `{name}: '1'` (quote an empty value: `{name}: ''`)")


def _check_gpu_count(value: Any, line: int, src: Source) -> None:
    """`ray_num_gpus` becomes `ray start --num-gpus N` on the node."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1024:
        raise src.error(line, f"ray_num_gpus must be a whole number of GPUs, not {describe(value)}",
                        "e.g. `ray_num_gpus: 1` (a DGX Spark has one GPU)")


def _check_gpu_clock_cap(value: Any, line: int, src: Source) -> None:
    """`gpu_clock_cap` is bootstrap's `nvidia-smi -lgc 0,MHZ` (node/gpuclock.py holds the same bounds)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 300 <= value <= 5000:
        raise src.error(line, f"gpu_clock_cap must be a GPU clock in MHz from 300 to 5000, not {describe(value)}",
                        "e.g. `gpu_clock_cap: 2000` (the cap that stopped GB10's hard power-offs)")


def _check_replicas(value: Any, line: int, src: Source) -> None:
    """`replicas` is serve's --replicas when not given: engines behind vLLM's router, which must divide the nodes."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 1024:
        raise src.error(line, f"replicas must be a whole number of engines, not {describe(value)}",
                        "e.g. `replicas: 2` (one engine per node of a pair, behind vLLM's router)")


def _check_node_path(key: str, example: str) -> Callable[[Any, int, Source], None]:
    """A program or a path on the node (`python`, `python_env`, `comm_env_path`): one line of text."""
    def check(value: Any, line: int, src: Source) -> None:
        if not isinstance(value, str) or not value.strip() or any(c in value for c in "\n\r\0"):
            raise src.error(line, f"{key} must be a path on the node, not {describe(value)}", f"e.g. `{key}: {example}`")
    return check


def _check_choice(key: str, choices: tuple[str, ...], what: str) -> Callable[[Any, int, Source], None]:
    """A word from a fixed set (`runtime`, `launcher`): a typo fails here with its line, not as a Docker error later."""
    def check(value: Any, line: int, src: Source) -> None:
        if value not in choices:
            raise src.error(line, f"{key} must be {' or '.join(choices)}, not {describe(value)}"
                            f"{did_you_mean(str(value), choices)}", f"e.g. `{key}: {choices[-1]}` ({what})")
    return check


def _check_min_driver(value: Any, line: int, src: Source) -> None:
    """`min_driver` is preflight's floor, compared number by number with the node's driver (590.44 < 590.48.01)."""
    wanted = 'min_driver must be an NVIDIA driver version such as "590.44"'
    fix = 'e.g. `min_driver: "590.44"` (the default; "580.95" lets a stock DGX OS 580.x driver pass)'
    if isinstance(value, float):
        raise src.error(line, f"{wanted}, in quotes, not the number {value!r} (YAML drops a version's trailing zeros)",
                        fix)
    if isinstance(value, bool) or not isinstance(value, str | int) or not _DRIVER_VERSION.fullmatch(str(value)):
        raise src.error(line, f"{wanted}, not {describe(value)}", fix)


def is_driver_version(text: str) -> bool:
    """Whether `text` reads as an NVIDIA driver version (590.44, 590.48.01): what a typed floor must be too."""
    return bool(_DRIVER_VERSION.fullmatch(text))


# The host vars the code reads, each checked where it is written, before any connection.
HOST_VAR_CHECKS: dict[str, Callable[[Any, int, Source], None]] = {
    "serve_env": check_serve_env,
    "ray_num_gpus": _check_gpu_count,
    "replicas": _check_replicas,
    "python": _check_node_path("python", "/usr/bin/python3"),
    "python_env": _check_node_path("python_env", "/opt/vllm-env"),
    "comm_env_path": _check_node_path("comm_env_path", "~/.config/sparkcluster/comm.env"),
    "fabric": check_fabric,
    "min_driver": _check_min_driver,
    "gpu_clock_cap": _check_gpu_clock_cap,
    # the cluster's serving runtime and launcher: what `bootstrap --runtime` records and every later command reads
    "runtime": _check_choice("runtime", ("docker", "host"), "Ray and vLLM from python_env, without Docker"),
    "launcher": _check_choice("launcher", ("ray", "native"), "vLLM's own multi-node mode, without Ray"),
}


def merge_layers(layers: Iterable[Layer]) -> Layer:
    settings: dict[str, Value] = {}
    free: dict[str, Any] = {}
    for layer_settings, layer_free in layers:
        settings.update(layer_settings)
        free.update(layer_free)
    return settings, free


def build_draft(name: str, settings: dict[str, Value], free: dict[str, Any], groups: tuple[str, ...], src: Source) -> Draft:
    """The host, or every problem of its settings (reported, the last one raised): one run names them all."""
    fields: dict[str, Any] = {}
    errors: list[InventoryError] = []
    for setting, value in settings.items():
        try:
            fields[setting] = _VALIDATORS[setting](value, src)
        except InventoryError as e:
            errors.append(e)
    if errors:
        for error in errors[:-1]:
            src.report(error)
        raise errors[-1]
    return Draft(Host(name=name, groups=groups, vars=free, **fields), {s: v.line for s, v in settings.items()})


def check_cluster(drafts: list[Draft], src: Source, hosts_line: int, no_head_fix: str) -> None:
    heads = [d for d in drafts if d.host.role == HEAD]
    if not heads:
        raise src.error(hosts_line, "no host is the head", no_head_fix)
    if len(heads) > 1:
        raise src.error(heads[1].lines["role"], f"two heads: {heads[0].host.name} and {heads[1].host.name}",
                        "make exactly one host the head; the others are workers")
    _check_unique(drafts, src, "address", lambda h: (_address_identity(h.address), h.port),
                  "give each host its own address (or port), or remove the duplicate host")
    _check_unique(drafts, src, "fabric_ip", lambda h: h.fabric_ip, "each host's QSFP interface needs its own IPv4 address")


def _check_unique(drafts: list[Draft], src: Source, setting: str, identity: Callable[[Host], Any], fix: str) -> None:
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


def check_keys(values: SourceMap, allowed: Sequence[str], src: Source, where: str) -> None:
    for key in values:  # every unknown key reported; the known ones are still read
        if key not in allowed:
            src.report(src.error(values.key_line(key), f"unknown key {key!r} {where}{did_you_mean(key, allowed)}",
                                 f"allowed keys: {', '.join(allowed)}"))


def mapping_at(parent: SourceMap, key: str, src: Source) -> SourceMap:
    """parent[key] as a mapping; empty where it is absent or left blank (`vars:` with everything commented out)."""
    value = parent.get(key)
    if value is None:
        return SourceMap(parent.line)
    if not isinstance(value, SourceMap):
        raise src.error(parent.key_line(key), f"`{key}` must be a mapping, not {describe(value)}",
                        f"write `{key}:` followed by indented `name: value` lines")
    return value


def check_name(name: Any, line: int, what: str, src: Source) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise src.error(line, f"{name!r} is not a valid {what} name",
                        "use letters, digits, '_', '.', '-' (and ':' in IPv6 addresses), starting with a letter, digit or '_'")


def check_group_name(name: Any, line: int, hosts: SourceMap, src: Source) -> None:
    check_name(name, line, "group", src)
    if name in hosts:
        raise src.error(line, f"{name!r} is both a group and a host", "rename the group or the host")


def inventory_name(value: Any, line: int, src: Source, path: Path) -> str:
    if value is None:
        return path.stem
    if isinstance(value, str) and value and value.isprintable():
        return value
    raise src.error(line, f"the inventory name must be one line of text, not {describe(value)}", "e.g. `name: lab`")


def model_ids(value: Any, line: int, key: str, src: Source) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, SourceList):
        raise src.error(line, f"{key} must be a list of Hugging Face repo ids, not {describe(value)}", f"e.g. `{key}: [Qwen/Qwen3-0.6B]`")
    for i, model in enumerate(value):
        if not isinstance(model, str) or not _is_model(model):
            raise src.error(value.item_line(i), f"{key}: {describe(model)} is not a Hugging Face repo id",
                            "write ORG/NAME or ORG/NAME@REVISION, e.g. Qwen/Qwen3-0.6B")
    return tuple(value)


# ---- values ----------------------------------------------------------------------------------------------
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}")
_USER = re.compile(r"[a-z_][a-z0-9_-]*[$]?")
_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_IFNAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,14}")
_HCA = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_DRIVER_VERSION = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}")


def _address(v: Value, src: Source) -> str:
    if isinstance(v.value, str) and (_is_ip(v.value) or _is_hostname(v.value)):
        return v.value
    raise src.error(v.line, f"{v.key} {describe(v.value)} is not an IP address or host name",
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


def _role(v: Value, src: Source) -> str:
    if isinstance(v.value, str) and v.value in (HEAD, WORKER):
        return v.value
    raise src.error(v.line, f"{v.key} must be 'head' or 'worker', not {describe(v.value)}",
                    "one host is the head (Ray head and API server); the others are workers")


def _user(v: Value, src: Source) -> str:
    if isinstance(v.value, str) and len(v.value) <= 32 and _USER.fullmatch(v.value):
        return v.value
    raise src.error(v.line, f"{v.key} {describe(v.value)} is not a valid user name",
                    "a Linux user name: up to 32 lowercase letters, digits, '_' or '-', starting with a letter or '_'")


def _port(v: Value, src: Source) -> int:
    value = v.value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
        return value
    raise src.error(v.line, f"{v.key} must be a port number from 1 to 65535, not {describe(v.value)}", f"e.g. `{v.key}: 22`")


def _become(v: Value, src: Source) -> bool:
    if isinstance(v.value, bool):
        return v.value
    raise src.error(v.line, f"{v.key} must be true or false, not {describe(v.value)}", f"e.g. `{v.key}: true`")


def _file(v: Value, src: Source, fix: str) -> str:
    if not isinstance(v.value, str) or not v.value or not v.value.isprintable():
        raise src.error(v.line, f"{v.key} must be a file path, not {describe(v.value)}", fix)
    path = os.path.normpath(src.dir / os.path.expanduser(v.value))
    if src.check_files and not os.path.isfile(path):
        raise src.error(v.line, f"{v.key}: {path} does not exist", fix)
    return path


def _key_file(v: Value, src: Source) -> str:
    return _file(v, src, "create a key with `ssh-keygen -t ed25519` and install it with `ssh-copy-id`, or correct the path "
                         "(a relative path starts at the inventory's directory)")


def _known_hosts_file(v: Value, src: Source) -> str:
    return _file(v, src, "write it with `ssh-keyscan HOST >> FILE` after checking the fingerprints, or correct the path "
                         "(a relative path starts at the inventory's directory)")


def _interface(v: Value, src: Source) -> str:
    if isinstance(v.value, str) and _IFNAME.fullmatch(v.value) and v.value not in (".", ".."):
        return v.value
    raise src.error(v.line, f"{v.key} {describe(v.value)} is not a network interface name",
                    "Linux interface names are 1-15 letters, digits, '_', '.' or '-', e.g. enp1s0f1np1 (`ip -br link` lists them)")


def _fabric_ip(v: Value, src: Source) -> str:
    try:
        ip = ipaddress.IPv4Address(v.value) if isinstance(v.value, str) else None
    except ValueError:
        ip = None
    if ip is None or ip.is_loopback or ip.is_unspecified or ip.is_multicast:
        raise src.error(v.line, f"{v.key} {describe(v.value)} is not a usable IPv4 address",
                        "the IPv4 address of the host's QSFP interface, e.g. 192.168.177.11; leave it out to detect it")
    return str(ip)


def _hcas(v: Value, src: Source) -> tuple[str, ...]:
    if isinstance(v.value, str):
        items = [(name.strip(), v.line) for name in v.value.split(",")]
    elif isinstance(v.value, SourceList):
        items = [(name, v.value.item_line(i)) for i, name in enumerate(v.value)]
    else:
        raise src.error(v.line, f"{v.key} must be a list of RDMA device names, not {describe(v.value)}",
                        f"e.g. `{v.key}: [rocep1s0f1, roceP2p1s0f1]`")
    for name, line in items:
        if not isinstance(name, str) or not _HCA.fullmatch(name):
            raise src.error(line, f"{v.key}: {describe(name)} is not an RDMA device name",
                            "use the names `ibdev2netdev` shows, e.g. rocep1s0f1")
    return tuple(name for name, _ in items)


def _is_model(text: str) -> bool:
    """The same rule `sparkcluster stage` applies, so bootstrap never provisions toward a model it then rejects."""
    try:
        ModelRef.parse(text)
    except UsageError:
        return False
    return True


_VALIDATORS: dict[str, Callable[[Value, Source], Any]] = {
    "address": _address, "role": _role, "user": _user, "port": _port, "key": _key_file, "known_hosts": _known_hosts_file,
    "become": _become, "qsfp_interface": _interface, "fabric_ip": _fabric_ip, "hcas": _hcas,
}
