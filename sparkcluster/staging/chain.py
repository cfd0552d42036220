"""The pipelined copy chain of `sparkcluster stage` (stager.py decides what to copy where): source -> n1 -> n2
...; each destination pulls every blob it lacks from the nearest healthy node before it, as soon as that node
holds it, so the total stays close to one transfer rather than growing with N as a star from one source does.

Blobs travel over plain TCP between the nodes' fabric addresses (`--transport tcp`, the default: `wire.py`,
`blobwire.py`), hashed as they arrive, or with rsync over ssh between the nodes themselves (`--transport
ssh`). Either way interrupted blobs wait in a hidden partial dir and resume, each received blob is checked
against the hash in its name, and links and then the ref are written last, so an interrupted copy never looks
complete (docs/failure-modes.md F14, F15).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address

from ..engine.command import Command
from ..engine.facts import HostFacts
from ..engine.modelref import ModelRef
from ..engine.parallel import parallel_map
from ..engine.remote import python_of
from ..engine.session import Session
from ..engine.transport import Unreachable, ssh_for_bulk
from ..node.linkstate import LinkState, read_links
from ..node.network import facing
from .blobwire import EXIT_CORRUPT
from .failures import BROKEN_LINK_EXITS, broken_link, corrupt_source, source_gone
from .hfcache import (
    PARTIAL_DIR,
    Manifest,
    NodeModel,
    NodeStatus,
    SnapshotFile,
    finalize_command,
    rsync_blobs_argv,
    verify_command,
)
from .space import free_bytes, no_space
from .wire import DataPlane, Sender, fetch_command, new_token, start_senders, stop_senders


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


@dataclass(frozen=True)
class CopyJob:
    """What the chain copies and how, as the stager decided it: every node's scan of its HF cache, the data
    plane, the streams per destination, and where progress goes."""

    session: Session
    model: ModelRef
    scans: Mapping[str, NodeModel]
    data_plane: DataPlane
    streams: int
    progress: Callable[[BlobDone], None]


class Chain:
    """The pipelined chain: each destination pulls every blob it lacks from the nearest healthy node before
    it in the chain, as soon as that node holds the blob."""

    def __init__(self, job: CopyJob, manifest: Manifest, chain: list[str], statuses: Mapping[str, NodeStatus],
                 addresses: Mapping[str, str], result: StageResult,
                 hops: Mapping[tuple[str, str], tuple[str, str]] | None = None) -> None:
        self.job = job
        self.transports = job.session.transports
        self.manifest = manifest
        self.chain = chain
        self.addresses = addresses
        # (up, down) -> their addresses on the cable between them, where that is not each one's own address (a
        # ring: each cable is its own subnets, so a node is reached at another address by each neighbour).
        self.hops = dict(hops or {})
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
        # Senders started for a route around a lost node, by (node, the address it is bound to): on a ring a node's
        # first sender faces the next node of the chain, on another cable's subnet than the one rerouted to it.
        self.detour_senders: dict[tuple[str, str], Sender] = {}
        self.sender_lock = threading.Lock()

    def run(self) -> None:
        for name in self.chain[1:]:
            if name in self.unpublish and not self._prepare(name):
                continue
            self._mkdirs(name)
            self._check_space(name)
        queues = {n: [b for b in self.blobs if b.blob in self.need[n]] for n in self.chain[1:]
                  if not self.failed[n].is_set()}
        workers = [n for n, queue in queues.items() for _ in range(min(self.job.streams, len(queue)))]
        started = time.monotonic()
        if self.job.data_plane == "tcp":
            self._start_senders()
        # `streams` workers per destination, each taking that node's next blob in manifest order, so a node
        # asks for blobs in the order its upstream receives them.
        try:
            parallel_map(lambda name: self._drain(name, queues[name]), workers, workers=len(workers),
                         on_abort=self.job.session.close)
        finally:
            stop_senders(self.transports, self.senders)
            for (holder, _), sender in self.detour_senders.items():
                stop_senders({holder: self.transports[holder]}, {holder: sender})
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
            self.transports, {n: f"{self.job.scans[n].model_dir}/blobs" for n in feeders},
            {n: self._ends(n, self._next(n))[0] for n in feeders},
            [*(self.addresses[n] for n in self.chain), *(a for pair in self.hops.values() for a in pair)], self.token)
        for name, failure in failures.items():
            self._fail(name, failure.message, f"{failure.fix}; or stage with --transport ssh")

    def _next(self, name: str) -> str:
        return self.chain[self.chain.index(name) + 1]

    def _ends(self, up: str, down: str) -> tuple[str, str]:
        """The addresses `up` sends from and `down` receives at, for a step of the chain."""
        return self.hops.get((up, down), (self.addresses[up], self.addresses[down]))

    def _route(self, up: str, down: str) -> tuple[str, str] | None:
        """`_ends` for a step of the chain, else (a route around a lost node) where `down` reaches `up`."""
        if self._next(up) == down:
            return self._ends(up, down)
        return detour(self.addresses[up], self.addresses[down], self.job.session.facts.get(up),
                      self.job.session.facts.get(down))

    def _sender(self, up: str, address: str) -> Sender | None:
        """The sender on `up` bound to `address`: the chain's own, or one started for a detour (None: `up` failed,
        recorded). It serves the run's addresses, the detour's receiver among them."""
        if up in self.senders and self.senders[up].address == address:
            return self.senders[up]
        with self.sender_lock:
            if (up, address) not in self.detour_senders:
                allowed = [*self.addresses.values(), *(a for pair in self.hops.values() for a in pair),
                           *(a for route in self._detours(up) for a in route)]
                senders, failures = start_senders(self.transports, {up: f"{self.job.scans[up].model_dir}/blobs"},
                                                  {up: address}, allowed, self.token)
                if up in failures:
                    self._fail(up, failures[up].message, failures[up].fix)
                    return None
                self.detour_senders[(up, address)] = senders[up]
            return self.detour_senders[(up, address)]

    def _detours(self, up: str) -> list[tuple[str, str]]:
        return [route for down in self.chain[self.chain.index(up) + 1:] if (route := self._route(up, down))]

    # ---- per node --------------------------------------------------------------------------------------
    def _run(self, name: str, command: Command) -> bool:
        """Run on a node; a failure marks the node failed (it drops out, its successors re-route)."""
        try:
            result = self.transports[name].run(command)
        except Unreachable as e:
            self._fail(name, e.message, e.fix)
            return False
        if not result.ok:
            self._fail(name, f"{command.label()} exited {result.exit_code}: {result.stderr_tail(3)}",
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
        d = self.job.scans[name].model_dir
        doomed = [f"{d}/blobs/{b}" for b in self.corrupt[name]]
        if not self.manifest.model.is_commit:
            doomed.insert(0, f"{d}/refs/{self.manifest.model.revision}")
        return not doomed or self._run(name, Command.argv(["rm", "-f", "--", *doomed]))

    def _mkdirs(self, name: str) -> None:
        d = self.job.scans[name].model_dir
        self._run(name, Command.argv(["mkdir", "-p", f"{d}/blobs/{PARTIAL_DIR}", f"{d}/refs", f"{d}/snapshots"]))

    def _check_space(self, name: str) -> None:
        """A copy that cannot fit fails before it starts, with the sizes; filling the disk midway would
        otherwise read as a failed link between two nodes."""
        needed = sum(b.size for b in self.blobs if b.blob in self.need[name])
        free = self._free_bytes(name)
        if free is not None and free < needed:
            self._fail(name, *self._no_space(name, needed, free))

    def _free_bytes(self, name: str) -> int | None:
        return free_bytes(self.transports[name], f"{self.job.scans[name].model_dir}/blobs")

    def _no_space(self, name: str, needed: int, free: int | None) -> tuple[str, str]:
        return no_space(name, str(self.job.model), self.job.scans[name].model_dir, needed, free)

    def _upstream(self, name: str) -> str | None:
        """The nearest node before `name` in the chain that has not failed."""
        for up in reversed(self.chain[: self.chain.index(name)]):
            if not self.failed[up].is_set():
                return up
        return None

    def _drain(self, name: str, queue: list[SnapshotFile]) -> None:
        while not self.failed[name].is_set():
            with self.lock:
                if not queue:
                    return
                blob = queue.pop(0)
            self._copy(name, blob)

    def _copy(self, name: str, blob: SnapshotFile) -> None:
        """Wait until the nearest healthy node upstream holds `blob`, then pull it; re-route if it drops."""
        while not self.failed[name].is_set():
            up = self._upstream(name)
            route = self._route(up, name) if up is not None else None
            if up is None or route is None:  # every node before it went away, or none left shares a subnet with it
                gone = [n for n in self.chain[: self.chain.index(name)] if self.failed[n].is_set()]
                return self._fail(name, *source_gone(name, gone, up, str(self.job.model)))
            if not self.have[(up, blob.blob)].wait(timeout=0.5):
                continue  # not there yet, or the upstream failed: look again
            if self._send(up, name, blob, route) or not self.failed[up].is_set():
                return  # done, or this node failed (recorded by _send)

    def _send(self, up: str, name: str, blob: SnapshotFile, route: tuple[str, str]) -> bool:
        started = time.monotonic()
        # ssh: rsync runs on the upstream node and pushes; tcp: blobwire runs on the destination and pulls.
        runs_on = up if self.job.data_plane == "ssh" else name
        attempts: list[tuple[int, str]] = []
        sender = self._sender(up, route[0]) if self.job.data_plane == "tcp" else None
        if self.job.data_plane == "tcp" and sender is None:
            return False
        for attempt in (1, 2):
            try:
                result = self.transports[runs_on].run(self._copy_command(up, name, blob, route, sender))
            except Unreachable as e:
                self._fail(runs_on, e.message, e.fix)
                return False
            attempts.append((result.exit_code, result.stderr))
            if result.exit_code != EXIT_CORRUPT or self.job.data_plane != "tcp":
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
            model = str(self.job.model)
            source_fault = corrupt_source(up, blob.path, model, attempts)
            if source_fault:
                self._fail(name, *source_fault)
                return False
            if self.job.data_plane == "tcp" and result.exit_code in BROKEN_LINK_EXITS:
                links = self._links(up), self._links(name)
                self._fail(name, *broken_link(up, name, blob.path, model, route,
                                              result.stderr_tail(1).removeprefix("blobwire: "), links))
                return False
            how = "by ssh (sparkcluster bootstrap sets that up)" if self.job.data_plane == "ssh" else \
                "over TCP (a firewall between the fabric addresses?), or stage with --transport ssh"
            self._fail(name, f"copy of {blob.path} from {up} failed: {result.stderr_tail(3)}",
                       f"check that {name} reaches {up} at {route[0]} {how}")
            return False
        # blobwire hashed the bytes as they arrived and named the file only once they matched
        if self.job.data_plane == "ssh" and not self._check_arrival(name, blob):
            return False
        seconds = time.monotonic() - started
        with self.lock:
            self.done_files[name] += 1
            node = self.result.nodes[name]
            node.bytes += blob.size
            done = self.done_files[name]
        self.have[(name, blob.blob)].set()
        self.job.progress(BlobDone(name, blob.blob, blob.path, blob.size, seconds, done, len(self.blobs)))
        return True

    def _copy_command(self, up: str, name: str, blob: SnapshotFile, route: tuple[str, str],
                      sender: Sender | None) -> Command:
        up_blobs, dest_blobs = f"{self.job.scans[up].model_dir}/blobs", f"{self.job.scans[name].model_dir}/blobs"
        if sender is not None:
            return fetch_command(python_of(self.transports[name].host), sender.endpoint, route[1],
                                 dest_blobs, blob.blob, blob.size, self.token)
        user = self.job.session.facts[name].user if name in self.job.session.facts else ""
        target = f"{user}@{route[1]}:{dest_blobs}/"
        return Command.argv(rsync_blobs_argv([f"{up_blobs}/{blob.blob}"], target, ssh_for_bulk()), timeout=24 * 3600)

    def _links(self, name: str) -> list[LinkState] | None:
        return read_links(self.transports[name])

    def _reachable(self, name: str) -> bool:
        try:
            self.transports[name].run(Command("true", timeout=15))
            return True
        except Unreachable as e:
            self._fail(name, e.message, e.fix)
            return False

    def _check_arrival(self, name: str, blob: SnapshotFile) -> bool:
        """The size, and the content against the hash in the blob's name."""
        d = self.job.scans[name].model_dir
        try:
            result = self.transports[name].run(verify_command(python_of(self.transports[name].host), d, [blob.blob]))
            size = self.transports[name].run(Command.argv(["stat", "-c", "%s", f"{d}/blobs/{blob.blob}"]))
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
        if self._run(name, finalize_command(self.job.scans[name].model_dir, self.manifest)):
            self.result.nodes[name].state = "complete"


def detour(up_own: str, down_own: str, up: HostFacts | None, down: HostFacts | None) -> tuple[str, str] | None:
    """Where `down` reaches `up` when the nodes between them in the chain went away: their own addresses where one
    subnet holds both (a pair, a switch, the LAN), else the two ends of a cable between them (a 3-ring: the head
    is a neighbour of both others), else None (a 4-ring's diagonal: no subnet joins them)."""
    if up is None or down is None or _one_subnet(down, up_own, down_own):
        return up_own, down_own
    return facing(up, down)


def _one_subnet(facts: HostFacts, other: str, own: str) -> bool:
    """Whether `own` (an address of the node of `facts`) has `other` on its subnet. A name (an ssh alias as
    the LAN address) cannot be told: as before, it is taken to reach."""
    try:
        ip = ip_address(other)
    except ValueError:
        return True
    held = [a for i in facts.interfaces for a in i.ipv4 if str(a.ip) == own]
    return not held or any(ip in a.network for a in held)
