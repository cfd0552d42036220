"""`sparkcluster stage MODEL`: one copy of a model's snapshot on every node. This half decides what to copy
where: it scans every node's HF cache, finds (or makes, `source.py`) the first complete copy, reports each
node's state (`--status`, `--verify full`), and hands the nodes that lack the model to the pipelined chain
over the QSFP fabric (`chain.py`), which moves the bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..engine.errors import SparkclusterError, UsageError
from ..engine.inventory import Host
from ..engine.locks import held
from ..engine.modelref import ModelRef
from ..engine.remote import HF_HOME, python_of
from ..engine.session import Session
from ..engine.transport import openssh_argv
from ..node.network import cable_order, choose_for, facing
from .chain import BlobDone, Chain, CopyJob, NodeResult, StageResult
from .hfcache import (
    Manifest,
    NodeModel,
    NodeStatus,
    node_status,
    parse_scan,
    scan_command,
    source_manifest,
    verify_command,
)
from .wire import TRANSPORTS, DataPlane

STAGE_LOCKS = f"{HF_HOME}/hub/.locks/sparkcluster"


class Stager:
    def __init__(self, session: Session, model: ModelRef, *, verify: str = "size", streams: int = 2,
                 data_plane: DataPlane = "tcp", over_lan: bool = False,
                 progress: Callable[[BlobDone], None] = lambda event: None) -> None:
        if verify not in ("size", "full"):
            raise UsageError(f"--verify must be size or full, not {verify!r}")
        if data_plane not in TRANSPORTS:
            raise UsageError(f"--transport must be {' or '.join(TRANSPORTS)}, not {data_plane!r}")
        self.data_plane = data_plane
        self.session = session
        self.model = model
        self.verify = verify
        self.streams = max(1, streams)
        self.over_lan = over_lan  # only to measure what the fabric is worth (benchmarks)
        self.progress = progress
        self.scans: dict[str, NodeModel] = {}

    # ---- reading ---------------------------------------------------------------------------------------
    def scan(self) -> dict[str, NodeModel]:
        def one(host: Host) -> tuple[str, NodeModel]:
            result = self.session.transport(host).run(scan_command(self.model))
            return host.name, parse_scan(result.stdout)

        self.scans = dict(self.session.each(one))
        return self.scans

    def close(self) -> None:
        """Drop every connection: threads waiting on remote commands return at once (interrupts)."""
        self.session.close()

    def bad_hashes(self, name: str, blobs: Sequence[str]) -> frozenset[str]:
        if not blobs:
            return frozenset()
        transport = self.session.transport(name)
        result = transport.run(verify_command(python_of(transport.host), self.scans[name].model_dir, list(blobs)))
        if not result.ok:
            raise SparkclusterError(f"{name}: could not check blob hashes: {result.stderr_tail(3)}",
                                    "is python3 installed on the node?")
        return frozenset(result.stdout.split())

    def choose_source(self, source: str) -> tuple[str, Manifest]:
        """`auto`: the head if it holds a complete snapshot, else any node that does; or a named node."""
        candidates = [h.name for h in self.session.hosts]
        if source == "head":
            candidates = [self.session.head.name]
        elif source != "auto":
            if source not in candidates:
                raise UsageError(f"--source {source!r} is not a host of the inventory", f"use one of: {', '.join(candidates)}")
            candidates = [source]
        else:
            candidates.sort(key=lambda n: n != self.session.head.name)
        for name in candidates:
            manifest = source_manifest(self.model, self.scans[name])
            if manifest:
                return name, manifest
        where = "the head" if source in ("auto", "head") else source
        raise SparkclusterError(
            f"no complete snapshot of {self.model} on {where if source != 'auto' else 'any node'}",
            "download it once on the head (`sparkcluster stage MODEL --source head` with huggingface_hub there) "
            "or from this machine with --source local",
        )

    def statuses(self, manifest: Manifest) -> dict[str, NodeStatus]:
        out = {}
        for name, node in self.scans.items():
            bad: frozenset[str] = frozenset()
            if self.verify == "full":
                present = [f.blob for f in manifest.unique_blobs() if node.blobs.get(f.blob) == f.size]
                bad = self.bad_hashes(name, present)
            out[name] = node_status(manifest, node, bad)
        return out

    # ---- copying ---------------------------------------------------------------------------------------
    def run(self, source: str = "auto") -> StageResult:
        if not self.scans:  # a scan made since the last change on the nodes serves: one round trip per node
            self.scan()
        source_name, manifest = self.choose_source(source)
        statuses = self.statuses(manifest)
        if not statuses[source_name].complete:  # --verify full found the source's own copy corrupt
            intact = [n for n, s in statuses.items() if s.complete and (source in ("auto", n))]
            if not intact:
                raise SparkclusterError(f"{source_name}'s copy of {self.model} is corrupt and no other node holds "
                                        "an intact one", "remove it there and stage again from a good copy "
                                        "(--source local, or a download on the head)")
            source_name = intact[0]
        result = StageResult(str(self.model), manifest.commit, source_name,
                             {n: NodeResult(s.state) for n, s in statuses.items()})
        result.nodes[source_name].state = "complete"
        # Along the cables: on a ring, each node after the source is a neighbour of the one before it.
        order = cable_order([source_name] + [h.name for h in self.session.hosts if h.name != source_name],
                            self.session.facts)
        chain = [n for n in order if n == source_name or not statuses[n].complete]
        for name in [n for n in statuses if statuses[n].complete]:
            result.nodes[name].state = "complete"
        if len(chain) == 1:
            return result
        addresses = {name: self._address(name) for name in chain}
        job = CopyJob(self.session, self.model, self.scans, self.data_plane, self.streams, self.progress)
        Chain(job, manifest, chain, statuses, addresses, result, self._hops(chain)).run()
        return result

    def _hops(self, chain: list[str]) -> dict[tuple[str, str], tuple[str, str]]:
        """Each step of the chain on the cable between its two nodes, where their own addresses (one each) are
        on different subnets: a ring's nodes share a subnet with each neighbour, on another twin each time."""
        facts = self.session.facts
        hops = {}
        for up, down in zip(chain, chain[1:]):
            ends = facing(facts[up], facts[down]) if up in facts and down in facts and not self.over_lan else None
            if ends and ends != (self._address(up), self._address(down)):
                hops[(up, down)] = ends
        return hops

    def _address(self, name: str) -> str:
        """Where other nodes send to: the node's QSFP address (never the LAN, unless measuring it)."""
        host = next(h for h in self.session.hosts if h.name == name)
        if self.over_lan:
            return host.address
        if name not in self.session.facts:
            raise SparkclusterError(f"{name}: no facts", "it was unreachable")
        return choose_for(host, self.session.facts[name]).ip  # a QsfpError names the host and the fix


def stage(session: Session, model: ModelRef, *, source: str = "auto", verify: str = "size", streams: int = 2,
          data_plane: DataPlane = "tcp", over_lan: bool = False,
          progress: Callable[[BlobDone], None] = lambda event: None) -> StageResult:
    """Make every node hold `model`: find or make the first copy, then fan it out over the fabric."""
    from .source import download_on, push_local  # only needed when no node holds the model yet

    head = session.head
    transports = session.transports
    stager = Stager(session, model, verify=verify, streams=streams, data_plane=data_plane, over_lan=over_lan,
                    progress=progress)
    # Two runs would share each node's partial directory and step on each other's partial blobs. The lock
    # lives beside huggingface_hub's own locks, in the cache staging writes to anyway.
    with held(session, f"stage-{model.dir_name}", f"a stage of {model}",
              "wait for it to finish (it makes the same copy), or stop it and run again", root=STAGE_LOCKS):
        if source == "local":
            push_local(model, head, transports[head.name], openssh_argv(head))
            return stager.run("head")
        if source in ("auto", "head"):
            stager.scan()
            holders = [n for n, scan in stager.scans.items() if source_manifest(model, scan)]
            if not holders or (source == "head" and head.name not in holders):
                download_on(transports[head.name], model, python_of(head))
                stager.scan()  # the head holds it now
        return stager.run(source)


def stage_status(session: Session, model: ModelRef, verify: str = "size") -> dict[str, Any]:
    """Per node: complete, missing files, corrupt or absent, against the first complete copy found."""
    stager = Stager(session, model, verify=verify)
    stager.scan()
    try:
        source, manifest = stager.choose_source("auto")
    except SparkclusterError:
        return {"model": str(model), "source": None, "commit": None,
                "nodes": {n: {"state": "absent" if not s.blobs else "incomplete", "missing": [], "corrupt": []}
                          for n, s in stager.scans.items()}}
    return {
        "model": str(model), "source": source, "commit": manifest.commit, "files": len(manifest.files),
        "bytes": manifest.total_bytes,
        "nodes": {n: {"state": s.state, "missing": list(s.missing), "corrupt": list(s.corrupt)}
                  for n, s in stager.statuses(manifest).items()},
    }
