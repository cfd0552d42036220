"""`sparkcluster stage MODEL`: one copy of a model's snapshot on every node, sent node to node over the QSFP
fabric in a pipelined chain (source -> n1 -> n2 ...: each node forwards a blob as soon as it holds it, so the
total stays close to one transfer rather than growing with N as a star from one source does).

Blobs travel over plain TCP between the nodes' fabric addresses (`--transport tcp`, the default: `wire.py`,
`blobwire.py`), hashed as they arrive, or with rsync over ssh between the nodes themselves (`--transport
ssh`: the bootstrap key mesh, AES-GCM, for encryption on the wire). Either way interrupted blobs wait in a
hidden partial dir and resume, each received blob is checked against the hash in its name, and links and
then the ref are written last, so an interrupted copy never looks complete (reference/dual-node-spec.md
F14/F15).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..engine.command import Command
from ..engine.modelref import ModelRef
from ..engine.errors import SparkclusterError, UsageError
from ..engine.facts import HostFacts
from .space import free_bytes, no_space
from .wire import EXIT_CORRUPT, TRANSPORTS, Sender, fetch_command, new_token, start_senders, stop_senders
from .hfcache import (
    PARTIAL_DIR, Manifest, NodeModel, NodeStatus, finalize_command, node_status, parse_scan, rsync_blobs_argv,
    scan_command, source_manifest, verify_command,
)
from ..engine.inventory import Host, Inventory
from ..engine.network import choose_for
from ..engine.parallel import parallel_map
from ..engine.transport import SSH_FOR_BULK, Transport, Unreachable, openssh_argv



@dataclass(frozen=True)
class BlobDone:
    """Progress: one blob arrived (and was verified) on `node`."""

    node: str
    blob: str
    path: str
    bytes: int
    seconds: float
    done_files: int
    total_files: int


@dataclass
class NodeResult:
    status_before: str
    bytes: int = 0
    seconds: float = 0.0
    state: str = "pending"  # complete | failed
    error: str = ""
    fix: str = ""


@dataclass
class StageResult:
    model: str
    commit: str
    source: str
    nodes: dict[str, NodeResult] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.state == "complete" for r in self.nodes.values())

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.nodes.values())


class Stager:
    def __init__(self, inventory: Inventory, transports: Mapping[str, Transport], facts: Mapping[str, HostFacts],
                 model: ModelRef, *, verify: str = "size", streams: int = 2, transport: str = "tcp",
                 over_lan: bool = False, progress: Callable[[BlobDone], None] = lambda event: None) -> None:
        if verify not in ("size", "full"):
            raise UsageError(f"--verify must be size or full, not {verify!r}")
        if transport not in TRANSPORTS:
            raise UsageError(f"--transport must be {' or '.join(TRANSPORTS)}, not {transport!r}")
        self.transport = transport
        self.inventory = inventory
        self.transports = transports
        self.facts = facts
        self.model = model
        self.verify = verify
        self.streams = max(1, streams)
        self.over_lan = over_lan  # only to measure what the fabric is worth (benchmarks)
        self.progress = progress
        self.scans: dict[str, NodeModel] = {}

    # ---- reading ---------------------------------------------------------------------------------------
    def scan(self) -> dict[str, NodeModel]:
        def one(host: Host) -> tuple[str, NodeModel]:
            result = self.transports[host.name].run(scan_command(self.model))
            return host.name, parse_scan(result.stdout)

        self.scans = dict(parallel_map(one, self.inventory.hosts, workers=len(self.inventory.hosts),
                                       on_abort=self.close))
        return self.scans

    def close(self) -> None:
        """Drop every connection: threads waiting on remote commands return at once (interrupts)."""
        for transport in self.transports.values():
            transport.close()

    def bad_hashes(self, name: str, blobs: Sequence[str]) -> frozenset[str]:
        if not blobs:
            return frozenset()
        result = self.transports[name].run(verify_command(self.scans[name].model_dir, list(blobs)))
        if not result.ok:
            raise SparkclusterError(f"{name}: could not check blob hashes: {result.stderr_tail(3)}",
                                    "is python3 installed on the node?")
        return frozenset(result.stdout.split())

    def choose_source(self, source: str) -> tuple[str, Manifest]:
        """`auto`: the head if it holds a complete snapshot, else any node that does; or a named node."""
        candidates = [h.name for h in self.inventory.hosts]
        if source == "head":
            candidates = [self.inventory.head.name]
        elif source != "auto":
            if source not in candidates:
                raise UsageError(f"--source {source!r} is not a host of the inventory", f"use one of: {', '.join(candidates)}")
            candidates = [source]
        else:
            candidates.sort(key=lambda n: n != self.inventory.head.name)
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
            bad = frozenset()
            if self.verify == "full":
                present = [f.blob for f in manifest.unique_blobs() if node.blobs.get(f.blob) == f.size]
                bad = self.bad_hashes(name, present)
            out[name] = node_status(manifest, node, bad)
        return out

    # ---- copying ---------------------------------------------------------------------------------------
    def run(self, source: str = "auto") -> StageResult:
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
        chain = [source_name] + [h.name for h in self.inventory.hosts
                                 if h.name != source_name and not statuses[h.name].complete]
        for name in [n for n in statuses if statuses[n].complete]:
            result.nodes[name].state = "complete"
        if len(chain) == 1:
            return result
        addresses = {name: self._address(name) for name in chain}
        Chain(self, manifest, chain, statuses, addresses, result).run()
        return result

    def _address(self, name: str) -> str:
        """Where other nodes send to: the node's QSFP address (never the LAN, unless measuring it)."""
        host = next(h for h in self.inventory.hosts if h.name == name)
        if self.over_lan:
            return host.address
        if name not in self.facts:
            raise SparkclusterError(f"{name}: no facts", "it was unreachable")
        return choose_for(host, self.facts[name]).ip  # a QsfpError names the host and the fix


class Chain:
    """The pipelined chain: each destination pulls every blob it lacks from the nearest healthy node before
    it in the chain, as soon as that node holds the blob."""

    def __init__(self, stager: Stager, manifest: Manifest, chain: list[str], statuses: Mapping[str, NodeStatus],
                 addresses: Mapping[str, str], result: StageResult) -> None:
        self.s = stager
        self.manifest = manifest
        self.chain = chain
        self.addresses = addresses
        self.result = result
        self.blobs = manifest.unique_blobs()
        self.need = {n: set(statuses[n].missing) | set(statuses[n].corrupt) for n in chain[1:]}
        self.unpublish = {n for n in chain[1:] if statuses[n].corrupt or statuses[n].unlinked}
        self.corrupt = {n: statuses[n].corrupt for n in chain[1:]}
        self.have = {(n, b.blob): threading.Event() for n in chain for b in self.blobs}
        for n in chain:
            for b in self.blobs:
                if n == chain[0] or b.blob not in self.need.get(n, set()):
                    self.have[(n, b.blob)].set()
        self.failed: dict[str, threading.Event] = {n: threading.Event() for n in chain}
        self.done_files = {n: len(self.blobs) - len(self.need[n]) for n in chain[1:]}
        self.lock = threading.Lock()
        self.token = new_token()
        self.senders: dict[str, Sender] = {}

    def run(self) -> None:
        for name in self.chain[1:]:
            if name in self.unpublish and not self._prepare(name):
                continue
            self._mkdirs(name)
            self._check_space(name)
        queues = {n: [b for b in self.blobs if b.blob in self.need[n]] for n in self.chain[1:]
                  if not self.failed[n].is_set()}
        workers = [n for n, queue in queues.items() for _ in range(min(self.s.streams, len(queue)))]
        started = time.monotonic()
        if self.s.transport == "tcp":
            self._start_senders()
        # `streams` workers per destination, each taking that node's next blob in manifest order, so a node
        # asks for blobs in the order its upstream receives them.
        try:
            parallel_map(lambda name: self._drain(name, queues[name]), workers, workers=len(workers),
                         on_abort=self.s.close)
        finally:
            stop_senders(self.s.transports, self.senders)
        for name in self.chain[1:]:
            node = self.result.nodes[name]
            node.seconds = time.monotonic() - started
            if self.failed[name].is_set():
                continue
            self._finalize(name)

    # ---- TCP senders ------------------------------------------------------------------------------------
    def _start_senders(self) -> None:
        """A sender on every node that feeds another (all but the last); one that cannot start drops out."""
        feeders = [n for n in self.chain[:-1] if not self.failed[n].is_set()]
        self.senders, failures = start_senders(
            self.s.transports, {n: f"{self.s.scans[n].model_dir}/blobs" for n in feeders},
            {n: self.addresses[n] for n in feeders}, [self.addresses[n] for n in self.chain], self.token)
        for name, (error, fix) in failures.items():
            self._fail(name, error, fix)

    # ---- per node --------------------------------------------------------------------------------------
    def _run(self, name: str, command: Command) -> bool:
        """Run on a node; a failure marks the node failed (it drops out, its successors re-route)."""
        try:
            result = self.s.transports[name].run(command)
        except Unreachable as e:
            self._fail(name, e.message, e.fix)
            return False
        if not result.ok:
            self._fail(name, f"`{command.display()[:80]}` exited {result.exit_code}: {result.stderr_tail(3)}",
                       "check the node's disk and permissions in its HF cache")
            return False
        return True

    def _fail(self, name: str, error: str, fix: str) -> None:
        with self.lock:
            node = self.result.nodes[name]
            if node.state != "failed":
                node.state, node.error, node.fix = "failed", error, fix
            self.failed[name].set()

    def _prepare(self, name: str) -> bool:
        """A node with a broken copy loses its ref first (while it is repaired it must not look complete),
        then its corrupt blobs (rsync's size-and-time check could otherwise keep a same-size corrupt one)."""
        d = self.s.scans[name].model_dir
        doomed = [f"{d}/blobs/{b}" for b in self.corrupt[name]]
        if not self.manifest.model.is_commit:
            doomed.insert(0, f"{d}/refs/{self.manifest.model.revision}")
        return not doomed or self._run(name, Command.argv(["rm", "-f", "--", *doomed]))

    def _mkdirs(self, name: str) -> None:
        d = self.s.scans[name].model_dir
        self._run(name, Command.argv(["mkdir", "-p", f"{d}/blobs/{PARTIAL_DIR}", f"{d}/refs", f"{d}/snapshots"]))

    def _check_space(self, name: str) -> None:
        """A copy that cannot fit fails before it starts, with the sizes; filling the disk midway would
        otherwise read as a failed link between two nodes."""
        needed = sum(b.size for b in self.blobs if b.blob in self.need[name])
        free = self._free_bytes(name)
        if free is not None and free < needed:
            self._fail(name, *self._no_space(name, needed, free))

    def _free_bytes(self, name: str) -> int | None:
        return free_bytes(self.s.transports[name], f"{self.s.scans[name].model_dir}/blobs")

    def _no_space(self, name: str, needed: int, free: int | None) -> tuple[str, str]:
        return no_space(name, str(self.s.model), self.s.scans[name].model_dir, needed, free)

    def _upstream(self, name: str) -> str | None:
        """The nearest node before `name` in the chain that has not failed."""
        for up in reversed(self.chain[: self.chain.index(name)]):
            if not self.failed[up].is_set():
                return up
        return None

    def _drain(self, name: str, queue: list) -> None:
        while not self.failed[name].is_set():
            with self.lock:
                if not queue:
                    return
                blob = queue.pop(0)
            self._copy(name, blob)

    def _copy(self, name: str, blob) -> None:
        """Wait until the nearest healthy node upstream holds `blob`, then pull it; re-route if it drops."""
        while not self.failed[name].is_set():
            up = self._upstream(name)
            if up is None:
                return self._fail(name, "no node left to copy from", "re-run stage once the source is back")
            if not self.have[(up, blob.blob)].wait(timeout=0.5):
                continue  # not there yet, or the upstream failed: look again
            if self._send(up, name, blob) or not self.failed[up].is_set():
                return  # done, or this node failed (recorded by _send)

    def _send(self, up: str, name: str, blob) -> bool:
        started = time.monotonic()
        # ssh: rsync runs on the upstream node and pushes; tcp: blobwire runs on the destination and pulls.
        runs_on = up if self.s.transport == "ssh" else name
        for attempt in (1, 2):
            try:
                result = self.s.transports[runs_on].run(self._copy_command(up, name, blob))
            except Unreachable as e:
                self._fail(runs_on, e.message, e.fix)
                return False
            if result.exit_code != EXIT_CORRUPT or self.s.transport != "tcp":
                break  # a corrupt stream (the partial is gone) is fetched again once, from the start
        if not result.ok:
            # Either end may be at fault: the destination if it is gone or full, the upstream if it is gone
            # (its successors re-route), else the link between them.
            if not self._reachable(name) or not self._reachable(up):
                return False
            if "No space left on device" in result.stderr:
                left = sum(b.size for b in self.blobs
                           if b.blob in self.need[name] and not self.have[(name, b.blob)].is_set())
                self._fail(name, *self._no_space(name, left, self._free_bytes(name)))
                return False
            how = "by ssh (sparkcluster bootstrap sets that up)" if self.s.transport == "ssh" else \
                "over TCP (a firewall between the fabric addresses?), or stage with --transport ssh"
            self._fail(name, f"copy of {blob.path} from {up} failed: {result.stderr_tail(3)}",
                       f"check that {name} reaches {up} at {self.addresses[up]} {how}")
            return False
        # blobwire hashed the bytes as they arrived and named the file only once they matched
        if self.s.transport == "ssh" and not self._check_arrival(name, blob):
            return False
        seconds = time.monotonic() - started
        with self.lock:
            self.done_files[name] += 1
            node = self.result.nodes[name]
            node.bytes += blob.size
            done = self.done_files[name]
        self.have[(name, blob.blob)].set()
        self.s.progress(BlobDone(name, blob.blob, blob.path, blob.size, seconds, done, len(self.blobs)))
        return True

    def _copy_command(self, up: str, name: str, blob) -> Command:
        up_blobs, dest_blobs = f"{self.s.scans[up].model_dir}/blobs", f"{self.s.scans[name].model_dir}/blobs"
        if self.s.transport == "tcp":
            return fetch_command(self.senders[up].endpoint, self.addresses[name], dest_blobs, blob.blob, blob.size,
                                 self.token)
        user = self.s.facts[name].user if name in self.s.facts else ""
        target = f"{user}@{self.addresses[name]}:{dest_blobs}/"
        return Command.argv(rsync_blobs_argv([f"{up_blobs}/{blob.blob}"], target, SSH_FOR_BULK), timeout=24 * 3600)

    def _reachable(self, name: str) -> bool:
        try:
            self.s.transports[name].run(Command("true", timeout=15))
            return True
        except Unreachable as e:
            self._fail(name, e.message, e.fix)
            return False

    def _check_arrival(self, name: str, blob) -> bool:
        """The size, and the content against the hash in the blob's name."""
        d = self.s.scans[name].model_dir
        try:
            result = self.s.transports[name].run(verify_command(d, [blob.blob]))
            size = self.s.transports[name].run(Command.argv(["stat", "-c", "%s", f"{d}/blobs/{blob.blob}"]))
        except Unreachable as e:
            self._fail(name, e.message, e.fix)
            return False
        if not result.ok or result.stdout.strip() or size.stdout.strip() != str(blob.size):
            self._run(name, Command.argv(["rm", "-f", f"{d}/blobs/{blob.blob}"]))
            self._fail(name, f"{blob.path} arrived corrupt (hash or size mismatch)", "re-run stage; if it repeats, "
                       "check the source's copy with `sparkcluster stage MODEL --status --verify full`")
            return False
        return True

    def _finalize(self, name: str) -> None:
        if self._run(name, finalize_command(self.s.scans[name].model_dir, self.manifest)):
            self.result.nodes[name].state = "complete"


def stage(inventory: Inventory, transports: Mapping[str, Transport], facts: Mapping[str, HostFacts],
          model: ModelRef, *, source: str = "auto", verify: str = "size", streams: int = 2, transport: str = "tcp",
          over_lan: bool = False, progress: Callable[[BlobDone], None] = lambda event: None) -> StageResult:
    """Make every node hold `model`: find or make the first copy, then fan it out over the fabric."""
    from .source import download_on, push_local  # only needed when no node holds the model yet

    head = inventory.head
    stager = Stager(inventory, transports, facts, model, verify=verify, streams=streams, transport=transport,
                    over_lan=over_lan, progress=progress)
    if source == "local":
        push_local(model, head, transports[head.name], openssh_argv(head))
        return stager.run("head")
    if source in ("auto", "head"):
        stager.scan()
        holders = [n for n, scan in stager.scans.items() if source_manifest(model, scan)]
        if not holders or (source == "head" and head.name not in holders):
            download_on(transports[head.name], model, str(head.vars.get("python", "python3")))
    return stager.run(source)


def stage_status(inventory: Inventory, transports: Mapping[str, Transport], facts: Mapping[str, HostFacts],
                 model: ModelRef, verify: str = "size") -> dict:
    """Per node: complete, missing files, corrupt or absent, against the first complete copy found."""
    stager = Stager(inventory, transports, facts, model, verify=verify)
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
