"""`nccl-report` reads a support bundle (`doctor --bundle`) as it reads log files: each NCCL-bearing file inside it
(a node's last verify log, its vLLM and Ray log tails) becomes one input, named `BUNDLE::nodes/NODE/FILE`.

A bundle comes from someone else (a support case), so it is read as untrusted: in one pass over the gzip stream
(finding a member by name in a gzip tar means decompressing up to it, so a pass per member is quadratic), each
member streamed into a spool of bounded size (never decoded whole), a cut-short or damaged archive a clean error,
and every member name shown escaped (a name is the author's bytes: terminal escapes, newlines)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import IO, TextIO

from ..engine.errors import UsageError

SEPARATOR = "::"
SUFFIXES = (".tar.gz", ".tgz")
LOG_FILES = ("last-verify.log", "logs.txt", "ray-logs.txt")
MAX_MEMBER_BYTES = 256 << 20  # what is read of one member; the rest is skipped
SPOOL_BYTES = 8 << 20  # a member up to this size is held in memory, a larger one in a temporary file
CHUNK = 1 << 20
NAMES_SHOWN = 5
MAKE_ONE = "make a new one with `sparkcluster doctor --bundle FILE.tar.gz`"

Opener = Callable[[], AbstractContextManager[TextIO]]  # a fresh text stream over one log, for each reader of it


@dataclass(frozen=True)
class BundleRef:
    path: str
    member: str | None  # None: every log inside; else the member(s) of that exact name


def bundle_ref(path: str) -> BundleRef | None:
    """The bundle (and member) a `BUNDLE` or `BUNDLE::MEMBER` argument names; None for a plain file."""
    bundle, sep, name = path.partition(SEPARATOR)
    if not (bundle.endswith(SUFFIXES) and os.path.isfile(bundle)):
        return None
    return BundleRef(bundle, name if sep else None)


def visible(name: str) -> str:
    """A member name as a terminal can show it harmlessly: control and format characters (escape sequences,
    newlines, bidirectional overrides) written as Python's escapes, and a backslash doubled so none is forged."""
    return "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii") for c in name)


def logs(ref: BundleRef) -> Iterator[tuple[str, Opener]]:
    """(shown name, opener) for each log of the bundle (or each member named `ref.member`), in archive order, read
    in one pass. An opener is valid until the next item is asked for. Raises UsageError for a bundle that cannot
    be read to its end, and, once the pass is over, for one without logs or without the member named."""
    try:
        raw = open(ref.path, "rb")  # closed by the with below
    except OSError as e:
        raise UsageError(f"{ref.path}: cannot read it ({e.strerror})", "pass a readable bundle") from None
    names: list[str] = []  # the logs seen, for the error that names the nearest
    folders: set[str] = set()
    counts: Counter[str] = Counter()
    with raw, gzip.GzipFile(fileobj=raw) as packed:
        try:
            with tarfile.open(fileobj=packed, mode="r:") as tar:
                for info in tar:  # each header read once, the data of the one before skipped or read: one pass
                    if info.isdir():
                        folders.add(info.name.rstrip("/"))
                    if not info.isfile():  # links, devices, FIFOs: nothing of theirs is a log
                        continue
                    is_log = info.name.endswith(LOG_FILES)
                    if not (info.name == ref.member if ref.member is not None else is_log):
                        if is_log:
                            names.append(info.name)
                        continue
                    counts[info.name] += 1
                    with _spooled(tar, info) as spool:
                        yield _shown(ref.path, info.name, counts[info.name]), partial(_text, spool)
            while packed.read(CHUNK):  # to the stream's end, where gzip checks its length and CRC
                pass
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
            raise UsageError(f"{ref.path}: the bundle is cut short or damaged ({e or type(e).__name__})",
                             f"download it again (a download that stopped midway is the usual cause), or {MAKE_ONE}"
                             ) from None
    if not counts:
        raise _nothing_found(ref, names, folders)


def _shown(bundle: str, name: str, nth: int) -> str:
    again = f" (member {nth} of that name)" if nth > 1 else ""  # each read as its own: a run is told by its name
    return f"{bundle}{SEPARATOR}{visible(name)}{again}"


@contextmanager
def _spooled(tar: tarfile.TarFile, info: tarfile.TarInfo) -> Iterator[IO[bytes]]:
    """The member's first MAX_MEMBER_BYTES, copied in chunks as they are decompressed."""
    source = tar.extractfile(info)
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as spool:
        left = MAX_MEMBER_BYTES
        while source is not None and left and (chunk := source.read(min(left, CHUNK))):
            spool.write(chunk)
            left -= len(chunk)
        yield spool


@contextmanager
def _text(spool: IO[bytes]) -> Iterator[TextIO]:
    spool.seek(0)
    text = io.TextIOWrapper(spool, encoding="utf-8", errors="replace")
    try:
        yield text
    finally:
        text.detach()  # the spool stays open for the next reader of the same member


def _nothing_found(ref: BundleRef, logs_seen: list[str], folders: set[str]) -> UsageError:
    if ref.member is None:
        return UsageError(f"{ref.path}: a bundle without logs", "make it with `sparkcluster doctor --bundle FILE.tar.gz`")
    member = visible(ref.member)
    every = "or pass the bundle alone to read every log in it"
    folder = ref.member.rstrip("/")
    inside = [n for n in logs_seen if n.startswith(f"{folder}/")]
    if inside or folder in folders:
        return UsageError(f"{ref.path}: {member} is a folder of the bundle, not a log",
                          f"name a log inside it: {_listed(sorted(inside))}, {every}" if inside
                          else f"it holds no log: {every}")
    if not logs_seen:
        return UsageError(f"{ref.path}: no member {member}, and no log at all", MAKE_ONE)
    import difflib  # only with a name to explain

    nearest = difflib.get_close_matches(ref.member, logs_seen, n=NAMES_SHOWN)
    return UsageError(f"{ref.path}: no member {member}",
                      f"name one of its logs (nearest first): {_listed(nearest)}, {every}" if nearest
                      else f"name one of its logs: {_listed(sorted(logs_seen))}, {every}")


def _listed(names: list[str]) -> str:
    more = f" (and {len(names) - NAMES_SHOWN} more)" if len(names) > NAMES_SHOWN else ""
    return ", ".join(visible(n) for n in names[:NAMES_SHOWN]) + more
