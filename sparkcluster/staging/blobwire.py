"""Blobs over plain TCP between the nodes' fabric addresses: a standalone script (standard library only) that
staging runs on the nodes through ssh, which only sets it up. The bytes never pass through ssh.

    python3 blobwire.py serve --bind IP --dir BLOBS --allow IP[,IP...]   (token on stdin; prints "PORT PID")
    python3 blobwire.py fetch --connect IP:PORT --source IP --dir BLOBS --blob NAME --size N   (token on stdin)
    python3 blobwire.py stream --connect IP:PORT --source IP --name NODE.parts --size N | docker load
    python3 blobwire.py tar-index --tar IMAGE.tar

`serve` also serves a parts plan (`NAME.parts`, JSON: a file and byte ranges of it): the pieces of a saved
image tar that one node lacks, sent as one valid tar stream, which `stream` writes to its stdout with
progress ("bytes N") on stderr. A plan that names a file to `follow` instead sends a file that `docker save`
is still writing, as it grows, to its end. `tar-index` lists a tar's members with their byte ranges, and the
image's manifest and config, for the control side to choose the ranges.

`serve` binds to one address (the node's fabric address), forks a detached server and returns its port: the
server sends a blob (zero-copy, `sendfile`) only to a peer whose address is allowed and whose first line
carries the run's one-time token; anything else is closed with nothing sent. It exits once idle.

`fetch` pulls one blob into the partial dir, resuming from what an interrupted fetch left there, hashes the
bytes as they arrive (sha256 for LFS blobs, git's blob hash for 40-hex names), and moves the file to its
final name only when the hash matches: an interrupted or corrupt copy never looks complete.

Every connection is bounded by `--stall S` (default 60): a peer that sends nothing for S seconds (a link that
died without a reset) ends the fetch or stream, a peer that stays unreachable that long fails the connection,
and TCP keepalive with TCP_USER_TIMEOUT lets the kernel drop a dead connection on either end (the control
side's `engine/deadlines.py` says the same; this script stands alone on the nodes, so it carries its own copy).

Exit codes of `fetch`: 0 done, 3 corrupt (the partial is removed; fetching again starts over), 4 the
connection failed (the partial is kept to resume), 5 refused by the server, 6 nothing arrived for `--stall`
seconds (the partial is kept to resume), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import hmac
import json
import os
import re
import socket
import struct
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:  # imported where it is used: only `tar-index` reads a tar
    import tarfile

PARTIAL_DIR = ".sparkcluster-partial"  # shared with rsync's --partial-dir: either transport resumes the other's
CHUNK = 1 << 20
IDLE_EXIT_S = 120.0  # a server nobody has used for this long exits (its controller died or forgot it)
REQUEST_TIMEOUT_S = 10.0
UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH)  # transient while a link comes back: retried within --stall
RECONNECT_S = 0.5
EXIT_CORRUPT, EXIT_CONNECTION, EXIT_REFUSED, EXIT_STALLED = 3, 4, 5, 6
DEFAULT_STALL_S = 60.0
BLOB_NAME = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
PARTS_NAME = re.compile(r"[A-Za-z0-9_-]+\.parts")
PLAN_FILE = re.compile(r"[A-Za-z0-9_-]+\.(tar|exit)")  # what a parts plan may name, in the served dir only
GROWING = -1  # the size a plan announces for a file still being written: the stream runs to the sender's end
TAR_END = b"\0" * 1024  # two zero blocks: the end of a tar archive


def blob_hasher(name: str, size: int) -> "hashlib._Hash":
    """sha256 for LFS blobs (named by it); git's blob hash (sha1 over a header) for small files in git."""
    if len(name) == 64:
        return hashlib.sha256()
    return hashlib.sha1(b"blob %d\0" % size)


# ---- serve -------------------------------------------------------------------------------------------------
def bound_socket(sock: socket.socket, stall: float) -> None:
    """The kernel ends a connection whose peer stays silent for about `stall` seconds: keepalive probes while
    idle, TCP_USER_TIMEOUT while sent bytes go unacknowledged; a read or send timeout bounds the rest. (The same
    options as engine/deadlines.py sets on the control side: this file runs alone on the nodes and imports none.)"""
    interval = int(max(1.0, min(15.0, stall / 4)))
    sock.settimeout(stall)
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", interval), ("TCP_KEEPINTVL", interval),
                        ("TCP_KEEPCNT", max(1, int(stall) // interval)), ("TCP_USER_TIMEOUT", int(stall * 1000))):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            pass


class Server:
    def __init__(self, listener: socket.socket, blobs: str, allowed: set[str], token: bytes,
                 stall: float = DEFAULT_STALL_S) -> None:
        self.stall = stall
        self.listener = listener
        self.blobs = blobs
        self.allowed = allowed
        self.token = token
        self.active = 0
        self.last_used = time.monotonic()
        self.lock = threading.Lock()

    def run(self) -> None:
        self.listener.settimeout(1.0)
        while True:
            try:
                conn, (peer, _) = self.listener.accept()
            except socket.timeout:
                with self.lock:
                    if not self.active and time.monotonic() - self.last_used > IDLE_EXIT_S:
                        return
                continue
            if peer not in self.allowed:
                conn.close()
                continue
            with self.lock:
                self.active += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(REQUEST_TIMEOUT_S)
                request = conn.makefile("rb").readline(512).split()
                if len(request) != 3 or not hmac.compare_digest(request[0], self.token):
                    return
                name, offset = request[1].decode(), int(request[2])
                if PARTS_NAME.fullmatch(name):
                    return self.send_parts(conn, name)
                if not BLOB_NAME.fullmatch(name):
                    return
                with open(os.path.join(self.blobs, name), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    conn.sendall(b"OK %d\n" % size)
                    bound_socket(conn, self.stall)  # a fetcher that went silent frees this thread
                    if offset < size:
                        conn.sendfile(f, offset, size - offset)
        except (OSError, ValueError):
            pass  # the fetcher sees the short stream and resumes
        finally:
            with self.lock:
                self.active -= 1
                self.last_used = time.monotonic()

    def send_parts(self, conn: socket.socket, name: str) -> None:
        with open(os.path.join(self.blobs, name)) as f:
            plan = json.load(f)
        if not all(PLAN_FILE.fullmatch(plan[key]) for key in ("file", "follow") if key in plan):
            return
        if "follow" in plan:
            return self.send_growing(conn, os.path.join(self.blobs, plan["file"]),
                                     os.path.join(self.blobs, plan["follow"]))
        ranges = [(int(start), int(length)) for start, length in plan["ranges"]]
        conn.sendall(b"OK %d\n" % (sum(length for _, length in ranges) + len(TAR_END)))
        bound_socket(conn, self.stall)
        with open(os.path.join(self.blobs, plan["file"]), "rb") as f:
            for start, length in ranges:
                conn.sendfile(f, start, length)
        conn.sendall(TAR_END)

    def send_growing(self, conn: socket.socket, path: str, exit_path: str) -> None:
        """A file while another process still writes it (`docker save` into it), to its end: done when the
        writer's exit status (in `exit_path`) is 0 and every byte is sent. A writer that failed, or stalled
        (killed with its shell), resets the connection: the reader fails rather than take a short stream
        for a whole one."""
        conn.sendall(b"OK %d\n" % GROWING)
        bound_socket(conn, self.stall)
        sent, grew = 0, time.monotonic()
        with open(path, "rb") as f:
            while True:
                finished = os.path.exists(exit_path)  # looked at first: all the writer wrote is in the size after
                size = os.fstat(f.fileno()).st_size
                if sent < size:
                    sent += conn.sendfile(f, sent, size - sent)
                    grew = time.monotonic()
                elif not finished and time.monotonic() - grew < IDLE_EXIT_S:
                    time.sleep(0.05)
                else:  # the writer ended, or stalled
                    status = "stalled"
                    if finished:
                        with open(exit_path) as written:
                            status = written.read().strip()
                        # Made but not yet written (`echo $? > FILE`: the shell opens it, then echo writes):
                        # the status comes a moment later, and taking "" for a failure would reset a whole tar.
                        if not status and time.monotonic() - grew < IDLE_EXIT_S:
                            time.sleep(0.05)
                            continue
                    if status != "0":
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return


def serve(args: argparse.Namespace, token: bytes) -> int:
    listener = socket.socket(socket.AF_INET6 if ":" in args.bind else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, 0))
    listener.listen(64)
    server = Server(listener, args.dir, set(args.allow.split(",")), token, args.stall)
    pid = os.fork()
    if pid:
        print(listener.getsockname()[1], pid, flush=True)
        return 0
    # The detached server: its own session, no terminal, nothing that ties it to the ssh session that
    # started it, so the parent's exit ends that session at once.
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    server.run()
    os._exit(0)


# ---- fetch -------------------------------------------------------------------------------------------------
def request(args: argparse.Namespace, token: bytes, name: str, offset: int) -> socket.socket | int:
    """A connection from our fabric address whose reply header announced `args.size` bytes; else an exit code."""
    host, port = args.connect.rsplit(":", 1)
    give_up = time.monotonic() + args.stall
    while True:
        try:
            conn = socket.create_connection((host.strip("[]"), int(port)), timeout=REQUEST_TIMEOUT_S,
                                            source_address=(args.source, 0))
            break
        except OSError as e:
            # A link that has just come back (or is training) answers "no route" until the neighbour entry
            # the outage left failed is probed again: that is waited out, within the same bound as a silent peer.
            if e.errno not in UNREACHABLE or time.monotonic() + RECONNECT_S >= give_up:
                return _fail(EXIT_CONNECTION, f"cannot connect to {args.connect}: {e}")
            time.sleep(RECONNECT_S)
    conn.sendall(b"%s %s %d\n" % (token, name.encode(), offset))
    header = _read_line(conn)
    if not header:
        conn.close()
        return _fail(EXIT_REFUSED, f"{args.connect} refused the request (token or address not accepted)")
    if header != b"OK %d" % args.size:
        conn.close()
        return _fail(EXIT_CORRUPT, f"{args.connect} holds {name} as {header!r}, not {args.size} bytes")
    bound_socket(conn, args.stall)
    return conn


def _stalled(args: argparse.Namespace, at: int, size: int) -> int:
    of = f" of {size}" if size >= 0 else ""
    return _fail(EXIT_STALLED, f"received nothing from {args.connect} for {args.stall:g} s (at byte {at}{of}): "
                               f"the link from {args.source} is silent")


def fetch(args: argparse.Namespace, token: bytes) -> int:
    partial_dir = os.path.join(args.dir, PARTIAL_DIR)
    os.makedirs(partial_dir, exist_ok=True)
    partial, final = os.path.join(partial_dir, args.blob), os.path.join(args.dir, args.blob)
    hasher = blob_hasher(args.blob, args.size)
    started = time.monotonic()
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+b", buffering=0) as out:
        offset = _rehash(out, hasher, args.size)
        conn = request(args, token, args.blob, offset)
        if isinstance(conn, int):
            return conn
        received = 0
        with conn:
            buffer = memoryview(bytearray(CHUNK))
            while offset < args.size:
                try:
                    n = conn.recv_into(buffer, min(CHUNK, args.size - offset))
                except socket.timeout:
                    return _stalled(args, offset, args.size)
                except OSError as e:  # reset, or the kernel gave up on a silent peer (ETIMEDOUT)
                    return _fail(EXIT_CONNECTION, f"{args.connect} broke off the stream at byte {offset} of "
                                                  f"{args.size}: {e}")
                if not n:
                    return _fail(EXIT_CONNECTION, f"{args.connect} closed the stream at byte {offset} of {args.size}")
                hasher.update(buffer[:n])
                out.write(buffer[:n])
                offset += n
                received += n
        got = hasher.hexdigest()
        if got != args.blob:
            os.unlink(partial)
            return _fail(EXIT_CORRUPT, f"{args.blob} arrived corrupt (its hash is {got}, not its name)")
        os.fsync(out.fileno())  # the data is on disk before the name says it is complete
    os.replace(partial, final)
    print(json.dumps({"bytes": received, "seconds": round(time.monotonic() - started, 3)}))
    return 0


def stream(args: argparse.Namespace, token: bytes) -> int:
    """A parts plan's bytes to stdout (into `docker load`), with the count on stderr about once a second."""
    conn = request(args, token, args.name, 0)
    if isinstance(conn, int):
        return conn
    out, done, shown = sys.stdout.buffer, 0, 0.0
    growing = args.size == GROWING
    buffer = memoryview(bytearray(CHUNK))
    with conn:
        while growing or done < args.size:
            try:
                n = conn.recv_into(buffer, CHUNK if growing else min(CHUNK, args.size - done))
            except socket.timeout:
                return _stalled(args, done, args.size)
            except OSError as e:  # a reset: the sender's writer failed
                return _fail(EXIT_CONNECTION, f"{args.connect} broke off the stream at byte {done}: {e}")
            if not n and growing:
                break
            if not n:
                return _fail(EXIT_CONNECTION, f"{args.connect} closed the stream at byte {done} of {args.size}")
            out.write(buffer[:n])
            done += n
            if time.monotonic() - shown >= 1:
                shown = time.monotonic()
                print(f"bytes {done}", file=sys.stderr, flush=True)
    out.flush()
    print(f"bytes {done}", file=sys.stderr, flush=True)
    return 0


def tar_index(path: str) -> int:
    """Each member's byte range (header to padded end), and the image's manifest and config, as JSON."""
    import tarfile

    with tarfile.open(path) as tar:
        members = tar.getmembers()
        manifest = json.load(_member(tar, "manifest.json"))
        config = json.load(_member(tar, manifest[0]["Config"]))
    ranges = [[m.name, m.offset, m.offset_data + (m.size + 511) // 512 * 512 - m.offset] for m in members]
    print(json.dumps({"members": ranges, "manifest": manifest, "diff_ids": config["rootfs"]["diff_ids"]}))
    return 0


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    """A regular file of the saved image; anything else means the tar is not one `docker save` wrote."""
    member = tar.extractfile(name)
    if member is None:
        raise ValueError(f"{name} in the image tar is not a regular file")
    return member


def _rehash(out: BinaryIO, hasher: "hashlib._Hash", size: int) -> int:
    """Hash what an interrupted fetch left and return where to resume; an oversized partial starts over."""
    have = os.fstat(out.fileno()).st_size
    if have > size:
        out.truncate(0)
        return 0
    for chunk in iter(lambda: out.read(CHUNK), b""):
        hasher.update(chunk)
    return have


def _read_line(conn: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n") and len(line) < 512:
        try:
            byte = conn.recv(1)
        except OSError:
            return b""
        if not byte:
            return b""
        line += byte
    return line.rstrip(b"\n")


def _fail(code: int, message: str) -> int:
    print(f"blobwire: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="blobwire")
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--bind", required=True)
    s.add_argument("--dir", required=True)
    s.add_argument("--allow", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--connect", required=True)
    f.add_argument("--source", required=True)
    f.add_argument("--dir", required=True)
    f.add_argument("--blob", required=True)
    f.add_argument("--size", type=int, required=True)
    st = sub.add_parser("stream")
    st.add_argument("--connect", required=True)
    st.add_argument("--source", required=True)
    st.add_argument("--name", required=True)
    st.add_argument("--size", type=int, required=True)
    for bounded in (s, f, st):
        bounded.add_argument("--stall", type=float, default=DEFAULT_STALL_S, help="seconds of silence that end a connection")
    sub.add_parser("tar-index").add_argument("--tar", required=True)
    args = parser.parse_args(argv)
    if args.mode == "tar-index":
        return tar_index(args.tar)
    if getattr(args, "blob", None) is not None and not BLOB_NAME.fullmatch(args.blob):
        return _fail(2, f"{args.blob!r} is not a blob name")
    token = sys.stdin.buffer.readline().strip()  # never in argv: other users of the node can read argv
    if not token:
        return _fail(2, "no token on stdin")
    modes = {"serve": serve, "fetch": fetch, "stream": stream}
    return modes[args.mode](args, token)


if __name__ == "__main__":
    sys.exit(main())
