"""The record of what a cluster runs, kept on the head (so `status`, `logs`, `down` and `bench` work from any
machine), and what only serving needs to know of the connected nodes: the fabric address each binds to, the
others it must not bind to, and the endpoint clients use."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.secret_names import masked_argv
from ..engine.session import Session
from ..engine.transport import Unreachable
from ..nccl.verdict import VerdictStatus
from ..node.addressing import routed_control_plane
from ..node.network import control_address
from .launch import LAUNCHERS, RUNTIMES, Launcher, RuntimeName
from .layout import Layout, Placement

RECORD_FILE = ".config/sparkcluster/serve.json"  # on the head, relative to the login user's home
# Version 1 is the first typed record; files written before it carried no version and read as version 1.
# Version 2 adds serving.pp (pipeline parallel); a version 1 record was written by a serve without it: pp 1.
# Version 3 adds serving.replicas (each replica's nodes and port, behind the router); before it, one engine.
# Version 4 adds serving.launched (the command line as launched, the recipe and mods by sha256); before it: unknown.
RECORD_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)



@dataclass(frozen=True)
class ProbeSummary:
    """The NCCL probe's verdict as serve recorded it: what produced bench's numbers includes how NCCL ran."""

    backend: str
    status: VerdictStatus
    cause: str


@dataclass(frozen=True)
class Launched:
    """What bench's receipt needs that only serve knows (serving/provenance.py builds it)."""

    command: tuple[str, ...]  # the head's `vllm serve` argv (replica 0's with replicas)
    recipe_source: str | None = None
    recipe_sha256: str | None = None  # None: the source is no file of the serving machine
    mods: tuple[tuple[str, str | None], ...] = ()  # (name, sha256 of its folder)


@dataclass(frozen=True)
class Serving:
    model: str
    served_name: str
    port: int
    endpoint: str
    tp: int
    recipe: str | None = None
    flags: tuple[str, ...] = ()
    verify: ProbeSummary | None = None
    pp: int = 1
    replicas: tuple[Placement, ...] = ()  # behind the router at `port`; empty: one engine answers there itself
    launched: Launched | None = None  # None: a record older than version 4

    @property
    def layout(self) -> Layout:
        return Layout(max(1, len(self.replicas)), self.tp, self.pp)


@dataclass(frozen=True)
class ServeRecord:
    runtime: RuntimeName
    launcher: Launcher
    image: str
    nodes: tuple[str, ...]
    serving: Serving | None = None
    version: int = RECORD_VERSION
    ray_fingerprint: str | None = None  # what started the Ray cluster (serving/reuse.py); None: not reusable

    def to_json(self) -> dict[str, Any]:
        serving = self.serving
        return {
            "version": self.version, "runtime": self.runtime, "launcher": self.launcher, "image": self.image,
            "nodes": list(self.nodes), "ray_fingerprint": self.ray_fingerprint,
            "serving": None if serving is None else {
                "model": serving.model, "served_name": serving.served_name, "port": serving.port,
                "endpoint": serving.endpoint, "tp": serving.tp, "pp": serving.pp, "recipe": serving.recipe,
                # Any secret left in vLLM's flags masked: the head's users read this file, bench publishes it.
                "flags": list(masked_argv(serving.flags)),
                "replicas": [{"index": p.index, "nodes": list(p.nodes), "port": p.port} for p in serving.replicas],
                "launched": None if serving.launched is None else {
                    "command": list(serving.launched.command), "recipe_source": serving.launched.recipe_source,
                    "recipe_sha256": serving.launched.recipe_sha256,
                    "mods": [{"name": n, "sha256": h} for n, h in serving.launched.mods]},
                "verify": None if serving.verify is None else {
                    "backend": serving.verify.backend, "status": str(serving.verify.status),
                    "cause": serving.verify.cause}},
        }

    @classmethod
    def from_json(cls, doc: object) -> ServeRecord:
        """Raises ValueError (with what is wrong) for a record this version cannot read."""
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        version = doc.get("version", 1)
        if version not in READABLE_VERSIONS:
            raise ValueError(f"version {version!r}; this sparkcluster reads versions "
                             f"{', '.join(map(str, READABLE_VERSIONS))}")
        runtime, launcher = doc.get("runtime"), doc.get("launcher", "ray")
        if runtime not in RUNTIMES or launcher not in LAUNCHERS:
            raise ValueError(f"runtime {runtime!r} / launcher {launcher!r}")
        serving = doc.get("serving")
        fingerprint = doc.get("ray_fingerprint")
        return cls(runtime, launcher, str(doc.get("image", "")), tuple(str(n) for n in doc.get("nodes") or ()),
                   None if not serving else _serving(serving),
                   ray_fingerprint=fingerprint if isinstance(fingerprint, str) else None)


def _serving(doc: dict[str, Any]) -> Serving:
    verify = doc.get("verify")
    return Serving(str(doc["model"]), str(doc["served_name"]), int(doc["port"]), str(doc["endpoint"]),
                   int(doc["tp"]), doc.get("recipe"), tuple(str(f) for f in doc.get("flags") or ()),
                   None if not verify else ProbeSummary(str(verify["backend"]), VerdictStatus(verify["status"]),
                                                        str(verify["cause"])),
                   int(doc.get("pp", 1)),  # absent from a version 1 record: serve ran no pipeline parallel then
                   tuple(Placement(int(p["index"]), tuple(str(n) for n in p["nodes"]), int(p["port"]))
                         for p in doc.get("replicas") or ()),  # absent before version 3: one engine
                   _launched(doc.get("launched")))


def _launched(doc: Any) -> Launched | None:
    if not doc:
        return None  # a record older than version 4
    return Launched(tuple(str(w) for w in doc["command"]), doc.get("recipe_source"), doc.get("recipe_sha256"),
                    tuple((str(m["name"]), m.get("sha256")) for m in doc.get("mods") or ()))


def write_record(session: Session, record: ServeRecord) -> None:
    transport = session.transport(session.head)
    # Private, and in a private folder (its temp file is written before its mode is set): the record names the model,
    # the command and the flags it was served with.
    transport.run(Command("mkdir -p .config/sparkcluster && chmod 700 .config/sparkcluster"))
    transport.write_file_atomic(RECORD_FILE, json.dumps(record.to_json(), indent=2).encode(), 0o600)


def read_record(session: Session) -> ServeRecord | None:
    """The head's record, or None where nothing was recorded."""
    data = session.transport(session.head).read_file(RECORD_FILE)
    if not data:
        return None
    try:
        return ServeRecord.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError) as e:
        raise SparkclusterError(f"{session.head.name}: the serve record ~/{RECORD_FILE} cannot be read ({e})",
                                "run `sparkcluster down` to stop what runs and clear it, then serve again") from None


def clear_record(session: Session) -> None:
    try:
        session.run(session.head, Command.argv(["rm", "-f", RECORD_FILE]))
    except Unreachable:
        pass  # nothing runs on a head that cannot be reached; its stale record is overwritten next time


def fabric_ips(session: Session) -> dict[str, str]:
    """From the facts: the address each node's control plane must use (its QSFP address; on a ring, where a
    link's address reaches one neighbour only, its routed node address or, with fabric.control_plane: lan, the
    management address: either reaches every node)."""
    return {h.name: control_address(h, session.facts[h.name], routed_control_plane(session.inventory, h))
            for h in session.hosts}


def other_ips(session: Session) -> dict[str, list[str]]:
    """Every other address of each node: joining Ray on one of these is a misconfiguration to name."""
    fabric = fabric_ips(session)
    return {h.name: [str(a.ip) for i in session.facts[h.name].interfaces for a in i.ipv4
                     if str(a.ip) != fabric[h.name]] + [h.address] for h in session.hosts}


def endpoint(head: Host, port: int) -> str:
    """The OpenAI-compatible base URL clients use: the head's address, as this machine reaches it."""
    return f"http://{head.address}:{port}/v1"
