"""The same container image on every node (F16): compare image IDs, and copy the head's image to the nodes that
lack it or hold another one, over the fabric, sending only the layers each node lacks.

How (chosen by measurement against a transient registry, see benchmarks/data_plane.py): the head saves the
image once, by ID, into a work dir. A node that holds none of its layers (a first copy) loads the tar as the
head writes it: the head's blob sender (`blobwire.py serve`, bound to its fabric address, the run's token, the
nodes' addresses only) follows the growing file, so save, transfer and load overlap. Otherwise the head saves
first, and for each node the control side picks the tar's byte ranges it needs (every member but the layers
the node already holds, by layer chain), which the sender streams as one tar. Either way the stream goes
straight into `docker load` on the node, every node at once. `docker load` skips a layer whose chain it holds
without reading it, and checks each layer it loads against the image's config; the image ID is compared on
every node afterwards.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.command import Command
from ..engine.deadlines import stall_seconds
from ..engine.errors import SparkclusterError, UsageError
from ..engine.inventory import Host
from ..engine.parallel import parallel_map
from ..engine.remote import python_command, python_line, python_of
from ..engine.transport import Transport, Unreachable, openssh_argv, ssh_destination
from .blobwire import GROWING, TAR_END
from .hops import Hop
from .space import free_bytes, size_text
from .wire import BLOBWIRE_PY, Sender, new_token, start_senders, stop_senders

WORK_DIR = ".cache/sparkcluster/image-sync"  # under the head's login home: the saved tar and the parts plans
SAVED_TAR = "image.tar"
SAVE_EXIT = "image.exit"  # docker save's exit status, written when it ends (the sender follows the tar till then)
LAYER_CHAINS = ("docker image ls -q --no-trunc | sort -u | "
                "xargs -r docker image inspect --format '{{json .RootFS.Layers}}'")


@dataclass(frozen=True)
class ImageBytes:
    """Progress: `done` of about `total` bytes of the image reached `node` (the saved stream is a little larger
    than the image's reported size, so `total` grows with `done`)."""

    node: str
    done: int
    total: int


@dataclass(frozen=True)
class ImageInfo:
    id: str | None  # None: the node lacks the image
    size: int = 0
    entrypoint: tuple[str, ...] | None = None
    layers: tuple[str, ...] = ()  # diff IDs, bottom first


def inspect(transport: Transport, image: str) -> ImageInfo:
    result = transport.run(Command.argv(["docker", "image", "inspect", "--format",
                                         "{{json .Id}} {{json .Size}} {{json .RootFS.Layers}} "
                                         "{{json .Config.Entrypoint}}", "--", image]))
    if not result.ok:
        if "No such image" in result.stderr or "No such object" in result.stderr:
            return ImageInfo(None)
        # Only docker's own words say whose fault it is: a bad name is the user's, not the docker group's.
        if "invalid reference format" in result.stderr:
            raise UsageError(f"{transport.host.name}: {image!r} is not a valid image name: {result.stderr_tail(1)}",
                             "name an image as REPOSITORY[:TAG], e.g. --image vllm-node or "
                             "--image nvcr.io/nvidia/vllm:25.09-py3")
        why = result.stderr_tail(2) or ("timed out" if result.exit_code == -1 else f"exit {result.exit_code}")
        raise SparkclusterError(f"{transport.host.name}: docker image inspect {image} failed: {why}",
                                docker_fix(transport.host.name, result.stderr))
    id_, size, layers, entrypoint = (json.loads(w) for w in result.stdout.split(" ", 3))
    return ImageInfo(id_, int(size), tuple(entrypoint) if entrypoint else None, tuple(layers or ()))


def docker_fix(node: str, stderr: str) -> str:
    if "permission denied" in stderr.lower() and "docker" in stderr.lower():
        return f"add the login user to the docker group on {node} (sparkcluster bootstrap does it), then connect again"
    return f"check that Docker runs on {node}: docker info"


def plan_copies(infos: Mapping[str, ImageInfo], head: str, image: str) -> list[str]:
    """The nodes that need the head's image; an error when the head lacks it."""
    if infos[head].id is None:
        raise SparkclusterError(f"the head {head} has no image {image!r}",
                                f"build or pull it on {head} (eugr: ./build-and-copy.sh), or name another with --image")
    return [name for name, info in infos.items() if info.id != infos[head].id]


def held_layers(transport: Transport, layers: Sequence[str]) -> int:
    """How many of an image's bottom `layers` (diff IDs) the node already holds, by layer chain: a layer is the
    same only on the same layers below it."""
    result = transport.run(Command(LAYER_CHAINS, timeout=120))
    if not result.ok:
        raise SparkclusterError(f"{transport.host.name}: listing its image layers failed: {result.stderr_tail(2)}",
                                docker_fix(transport.host.name, result.stderr))
    best = 0
    for line in filter(str.strip, result.stdout.splitlines()):
        chain = json.loads(line) or ()
        n = 0
        while n < min(len(chain), len(layers)) and chain[n] == layers[n]:
            n += 1
        best = max(best, n)
    return best


def ranges_for(index: Mapping[str, Any], held: int) -> list[tuple[int, int]]:
    """The saved tar's byte ranges a node needs: every member but the layer files of its `held` bottom layers."""
    skip = set(index["manifest"][0]["Layers"][:held])
    return [(start, length) for name, start, length in index["members"] if name not in skip]


class HeadSender:
    """The head's saved image and its blob sender, for the length of one sync; removed afterwards."""

    def __init__(self, head: Host, transport: Transport, image: str, head_info: ImageInfo, fabric_ip: str) -> None:
        self.head, self.transport, self.image, self.info, self.fabric_ip = head, transport, image, head_info, fabric_ip
        self.token = new_token()
        self.sender: Sender | None = None
        self.saver_pid: int | None = None  # a growing save still running

    def _run(self, command: Command, what: str) -> str:
        result = self.transport.run(command)
        if not result.ok:
            raise SparkclusterError(f"{self.head.name}: {what} failed: {result.stderr_tail(3)}",
                                    docker_fix(self.head.name, result.stderr))
        return result.stdout

    def _make_room(self) -> str:
        """The work dir, checked for room for the image first; returns the saved tar's path."""
        self._run(Command.argv(["mkdir", "-p", WORK_DIR]), "creating the image work dir")
        free = free_bytes(self.transport, WORK_DIR)
        if free is not None and free < self.info.size:
            raise SparkclusterError(f"no space on {self.head.name} to save {self.image} ({size_text(self.info.size)}, "
                                    f"has {size_text(free)})", f"free space under ~/{WORK_DIR} on {self.head.name}")
        return f"{WORK_DIR}/{SAVED_TAR}"

    def save(self) -> dict[str, Any]:
        """`docker save` into the work dir, and the tar's index."""
        tar = self._make_room()
        # The ID, not the name: the image saved is the one compared, even if the tag moves meanwhile.
        self._run(Command(f"docker save -o {tar}.tmp {shlex.quote(self.info.id or self.image)} && "
                          f"mv -f {tar}.tmp {tar}", timeout=3600), f"docker save {self.image}")
        index: dict[str, Any] = json.loads(self._run(
            python_command(python_of(self.head), BLOBWIRE_PY, "tar-index", "--tar", tar, timeout=600,
                           name=f"`blobwire tar-index {tar}`"),
            "reading the saved image"))
        return index  # saved by ID, the image has no name in the tar: each node tags what it loaded

    def save_growing(self) -> None:
        """`docker save` into the work dir in the background, detached from the ssh session: the sender follows
        the tar as it grows, so saving, sending and the nodes' loads overlap instead of following each other."""
        tar = self._make_room()
        save = (f"docker save {shlex.quote(self.info.id or self.image)} > {tar} 2> {WORK_DIR}/save.err; "
                f"echo $? > {WORK_DIR}/{SAVE_EXIT}.new && mv {WORK_DIR}/{SAVE_EXIT}.new {WORK_DIR}/{SAVE_EXIT}")
        # The status file appears whole (renamed into place): the sender reads it the moment it exists.
        # Only `setsid sh` goes to the background, so $! is that shell: its own process group, which close()
        # kills with docker's client in it (with `a && b & echo $!`, $! was a subshell and the kill missed).
        started = self._run(Command(f"rm -f {WORK_DIR}/{SAVE_EXIT} && : > {tar} || exit 1; "
                                    f"setsid sh -c {shlex.quote(save)} >/dev/null 2>&1 </dev/null & echo $!"),
                            f"starting docker save {self.image}")
        self.saver_pid = int(started)

    def check_saved(self) -> None:
        """Raises if a growing save ended and failed (one still running, or done, is no error of its own)."""
        status, _, error = self._run(Command(f"cat {WORK_DIR}/{SAVE_EXIT} 2>/dev/null; echo; tail -c 300 "
                                             f"{WORK_DIR}/save.err 2>/dev/null; true"),
                                     "reading the save's status").partition("\n")
        if status.strip() not in ("", "0"):
            raise SparkclusterError(f"{self.head.name}: docker save {self.image} failed (exit {status.strip()}): "
                                    f"{' '.join(error.split())}", docker_fix(self.head.name, error))

    def plan(self, node_index: int, ranges: list[tuple[int, int]] | None) -> tuple[str, int]:
        """Writes the node's parts plan (None: the whole tar as `save_growing` writes it); returns its name and
        the bytes it will send (with the tar's end), or GROWING."""
        name = f"node{node_index}.parts"
        plan = {"file": SAVED_TAR, "follow": SAVE_EXIT} if ranges is None else {"file": SAVED_TAR, "ranges": ranges}
        self.transport.write_file_atomic(f"{WORK_DIR}/{name}", json.dumps(plan).encode(), 0o600)
        return name, GROWING if ranges is None else sum(length for _, length in ranges) + len(TAR_END)

    def start(self, allowed: Sequence[str]) -> str:
        name = self.head.name
        senders, failures = start_senders({name: self.transport}, {name: WORK_DIR}, {name: self.fabric_ip}, allowed,
                                          self.token)
        if failures:
            raise SparkclusterError(f"{name}: {failures[name].message}", failures[name].fix)
        self.sender = senders[name]
        return self.sender.endpoint

    def close(self) -> None:
        if self.sender:
            stop_senders({self.head.name: self.transport}, {self.head.name: self.sender})
        try:
            if self.saver_pid:  # its own process group (setsid): the shell and docker's client with it
                self.transport.run(Command(f"grep -qa 'docker save' /proc/{self.saver_pid}/cmdline 2>/dev/null && "
                                           f"kill -- -{self.saver_pid}; true", timeout=15))
            self.transport.run(Command.argv(["rm", "-rf", "--", WORK_DIR], timeout=120))
        except Unreachable:
            pass  # a head that is gone took its work dir's contents with it


class LoadFailed(SparkclusterError):
    """A node's load of the image failed; `node` names it, so that what it failed for can be told (sync_along)."""

    def __init__(self, node: str, message: str, fix: str) -> None:
        super().__init__(message, fix)
        self.node = node


def load_on(node: Host, endpoint: str, source_ip: str, parts: str, size: int, expected: int, token: str,
            image: str, image_id: str, progress: Callable[[ImageBytes], None]) -> int:
    """On `node`, through OpenSSH (so progress arrives as it happens): its parts stream into `docker load`,
    then the image's name on the loaded ID. Returns the bytes that arrived; `expected` is for progress only
    (a growing save's size is known once it ends)."""
    stream = python_line(python_of(node), BLOBWIRE_PY, "stream", "--connect", endpoint, "--source", source_ip,
                         "--name", parts, "--size", str(size), "--stall", f"{stall_seconds():g}")
    pipeline = (f"set -o pipefail; {stream} | docker load -q && "
                f"docker tag {shlex.quote(image_id)} {shlex.quote(image)}")
    process = subprocess.Popen([*openssh_argv(node), ssh_destination(node), f"bash -c {shlex.quote(pipeline)}"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors: list[str] = []
    arrived = [0]

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith("bytes "):
                arrived[0] = int(line.split()[1])
                progress(ImageBytes(node.name, arrived[0], max(expected, arrived[0])))
            else:
                errors.append(line.rstrip())

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(token + "\n")  # the token on stdin, never in argv
    process.stdin.close()
    stdout = process.stdout.read()  # not communicate(): it would read stderr too, taking lines from the reader
    process.wait()
    reader.join()
    if process.returncode != 0:
        raise LoadFailed(
            node.name,
            f"loading image {image} on {node.name} from the head's sender at {endpoint} failed "
            f"(exit {process.returncode}): " + ("; ".join(errors[-3:]) or stdout.strip()[-200:]),
            f"check that {node.name} reaches {endpoint} over the fabric and has room for the image; "
            "then run `sparkcluster image sync` again (layers already loaded are not sent again)")
    return arrived[0]


def sync_from_head(head: Host, nodes: Sequence[Host], transports: Mapping[str, Transport], fabric: Mapping[str, str],
                   image: str, head_info: ImageInfo, progress: Callable[[ImageBytes], None]) -> dict[str, int]:
    """Copies the head's image to `nodes` (which lack it), every node at once; returns the bytes sent to each.

    When no node holds any of the image's layers (a first copy), the nodes load the tar while the head still
    saves it; otherwise the head saves it first, and each node gets only the parts it lacks."""
    held = dict(zip((n.name for n in nodes), parallel_map(lambda n: held_layers(transports[n.name], head_info.layers),
                                                           nodes, workers=len(nodes))))
    sender = HeadSender(head, transports[head.name], image, head_info, fabric[head.name])
    growing = not any(held.values())
    try:
        if growing:
            sender.save_growing()
            plans = {n.name: sender.plan(i, None) for i, n in enumerate(nodes)}
        else:
            index = sender.save()
            plans = {n.name: sender.plan(i, ranges_for(index, held[n.name])) for i, n in enumerate(nodes)}
        endpoint = sender.start([fabric[n.name] for n in nodes])
        expected = {name: size if size != GROWING else head_info.size for name, (_, size) in plans.items()}
        try:
            sent = parallel_map(lambda n: load_on(n, endpoint, fabric[n.name], *plans[n.name], expected[n.name],
                                                  sender.token, image, head_info.id or image, progress),
                                nodes, workers=len(nodes))
        except SparkclusterError:
            if growing:
                sender.check_saved()  # a failed save broke the streams off: its own error says why
            raise
    finally:
        sender.close()
    return dict(zip((n.name for n in nodes), sent))


def sync_along(hops: Sequence[Hop], hosts: Mapping[str, Host], transports: Mapping[str, Transport], image: str,
               head_info: ImageInfo, progress: Callable[[ImageBytes], None]) -> dict[str, int]:
    """Each hop in turn (image_hops: on a ring, each hop's source got the image in the hop before); returns the bytes
    sent to each node. A hop that fails stops the sync, and the error names the nodes it left without the image."""
    sent: dict[str, int] = {}
    for i, hop in enumerate(hops):
        try:
            sent.update(sync_from_head(hosts[hop.source], [hosts[n] for n in hop.receivers], transports, hop.ips,
                                       image, head_info, progress))
        except SparkclusterError as e:
            raise _stopped(e, hop, [n for later in hops[i + 1:] for n in later.receivers], transports, image) from e
    return sent


def _stopped(error: SparkclusterError, hop: Hop, unsynced: list[str], transports: Mapping[str, Transport],
             image: str) -> SparkclusterError:
    """`error` of `hop`, which left `unsynced` (the later hops' nodes) without the image. Where a node of the hop
    went away (it answers no command now), that is the cause, and bringing it back the fix."""
    failed = error.node if isinstance(error, LoadFailed) else None
    gone = next((n for n in dict.fromkeys([hop.source, *([failed] if failed else [])]) if _gone(transports[n])), None)
    if gone is None:
        if not unsynced:
            return error
        through = failed or hop.source
        return SparkclusterError(f"{error.message}; {_were(unsynced)} not synced (the image reaches "
                                 f"{'it' if len(unsynced) == 1 else 'them'} through {through})", error.fix)
    if gone == hop.source:  # its receivers were cut off with it
        unsynced = [*hop.receivers, *unsynced]
    host = transports[gone].host
    return SparkclusterError(
        f"{gone} went away during the sync of {image}" + (f"; {_were(unsynced)} not synced" if unsynced else ""),
        f"bring {gone} back (check that it is powered on and reachable: ssh -p {host.port} {host.address} true), then "
        f"run `sparkcluster image sync {image}` again: the layers already loaded are not sent again")


def _were(names: Sequence[str]) -> str:
    return f"{', '.join(names)} {'was' if len(names) == 1 else 'were'}"


def _gone(transport: Transport) -> bool:
    try:
        transport.run(Command("true", timeout=15))
        return False
    except Unreachable:
        return True
