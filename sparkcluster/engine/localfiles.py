"""Files on this machine that someone else may have made: a JSON document given to read (a result, a baseline, a
resume state), and a file written where a link or a device may already lie.

Read: only a regular file has an end (`/dev/zero` never does, and opening a FIFO waits for a writer forever), so the
file is opened without blocking and refused unless fstat calls it regular; then at most `limit` bytes are read, and
what json.loads raises on hostile text (a 5000-digit integer is a plain ValueError, 100 000 brackets a
RecursionError) becomes the one UsageError (exit 2) naming the file and the fix, as does a document nested deeper
than any we write (code that walks it recursively would otherwise fail later, far from the file).

Written: into a temporary file of its own in the target's folder, created exclusively and never through a link
(mkstemp: O_CREAT|O_EXCL|O_NOFOLLOW, a random name another user cannot plant a link at), renamed over the target
once whole, so a reader or a crash sees the old file or the new one, and a link at the target is replaced, its
target untouched. A device, FIFO, socket or folder at the target is refused rather than replaced by a file (as
root, `/dev/null` would have become one).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .errors import UsageError

MAX_JSON_BYTES = 64 << 20
MAX_DEPTH = 100  # deeper than anything sparkcluster writes (a receipt is about 6 levels), shallow enough to walk

_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


def read_bytes(path: Path, shown: str, what: str, fix: str, limit: int = MAX_JSON_BYTES) -> bytes:
    """A regular file's bytes, at most `limit` of them; UsageError (exit 2) naming `shown` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, to be refused below
    except FileNotFoundError:
        raise UsageError(f"{shown}: no such file", fix) from None
    except OSError as e:
        raise UsageError(f"{shown}: cannot read it ({e.strerror or e})", fix) from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{shown}: not a regular file ({kind_of(mode)}), so not {what}", fix)
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise UsageError(f"{shown}: cannot read it ({e.strerror or e})", fix) from None
    if len(data) > limit:
        raise UsageError(f"{shown}: larger than {limit >> 20} MiB, so not {what}", fix)
    return data


def read_json(path: Path, shown: str, what: str, fix: str, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON document from a file someone gave us, `what` it should be named in the refusal ("a bench result")."""
    data = read_bytes(path, shown, what, fix, limit)
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{shown}: not UTF-8 text, so not {what}", fix) from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{shown}:{e.lineno}: not JSON ({e.msg}), so not {what}", fix) from None
    except ValueError as e:  # json's own: an integer past Python's digit limit (its message advises a setting)
        raise UsageError(f"{shown}: holds a number too long to read ({str(e).split(':')[0]}), so not {what}",
                         fix) from None
    except RecursionError:
        raise UsageError(f"{shown}: nested deeper than JSON can be read here, so not {what}", fix) from None
    if _deeper_than(doc, MAX_DEPTH):
        raise UsageError(f"{shown}: nested deeper than {MAX_DEPTH} levels, so not {what}", fix)
    return doc


def _deeper_than(doc: Any, limit: int) -> bool:
    """Without recursion: a walk of its own must not be what fails on the depth it checks."""
    level: list[Any] = [doc]
    for _ in range(limit):
        level = [child for node in level if isinstance(node, dict | list)
                 for child in (node.values() if isinstance(node, dict) else node)]
        if not level:
            return False
    return any(isinstance(node, dict | list) for node in level)


def check_replaceable(path: Path, shown: str, fix: str) -> None:
    """Refuses (exit 2) a target that is neither absent, a regular file nor a link: replacing a device, a FIFO or a
    socket by a file is never what a user asked for. Called before anything connects, and again at the write."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise UsageError(f"{shown}: cannot look at it ({e.strerror or e})", fix) from None
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise UsageError(f"{shown}: {path} is {kind_of(mode)}, not a regular file", fix)


@contextlib.contextmanager
def replacing(path: Path, mode: int = 0o644, shown: str = "",
              fix: str = "name a regular file, or a new one") -> Iterator[IO[bytes]]:
    """A binary file to write `path`'s new content to; renamed over `path` with `mode` once the block ends, removed
    if it raises."""
    check_replaceable(path, shown or str(path), fix)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_text(path: Path, text: str, mode: int = 0o644) -> Path:
    """`text` as `path`'s whole content, written as `replacing` writes; the folder is made where it is missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, mode) as f:
        f.write(text.encode("utf-8"))
    return path
