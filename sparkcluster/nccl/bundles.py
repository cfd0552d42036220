"""`nccl-report` reads a support bundle (`doctor --bundle`) as it reads log files: each NCCL-bearing file inside it
(a node's last verify log, its vLLM and Ray log tails) becomes one input, named `BUNDLE::nodes/NODE/FILE`."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Sequence
from typing import TextIO

from ..engine.errors import UsageError

SEPARATOR = "::"
LOG_FILES = ("last-verify.log", "logs.txt", "ray-logs.txt")
MAX_MEMBER_BYTES = 256 << 20


def is_bundle(path: str) -> bool:
    return path.endswith((".tar.gz", ".tgz")) and os.path.isfile(path) and tarfile.is_tarfile(path)


def expand(paths: Sequence[str]) -> list[str]:
    """Every path as given, a bundle replaced by its log files (`BUNDLE::member`)."""
    out: list[str] = []
    for path in paths:
        if not is_bundle(path):
            out.append(path)
            continue
        try:
            with tarfile.open(path) as tar:
                members = [m.name for m in tar.getmembers() if m.isfile() and m.name.endswith(LOG_FILES)]
        except (tarfile.TarError, OSError) as e:
            raise UsageError(f"{path}: cannot read the bundle ({e})", "pass the file `doctor --bundle` wrote") from None
        if not members:
            raise UsageError(f"{path}: a bundle without logs", "make it with `sparkcluster doctor --bundle FILE.tar.gz`")
        out += [f"{path}{SEPARATOR}{name}" for name in sorted(members)]
    return out


def member(path: str) -> tuple[str, str] | None:
    """(bundle, member) of a `BUNDLE::member` name; None for a plain file."""
    bundle, sep, name = path.partition(SEPARATOR)
    return (bundle, name) if sep and is_bundle(bundle) else None


def open_member(path: str) -> TextIO:
    found = member(path)
    if found is None:
        raise UsageError(f"{path}: not a file inside a bundle", "pass log files or a bundle")
    with tarfile.open(found[0]) as tar:
        stream = tar.extractfile(found[1])
        data = stream.read(MAX_MEMBER_BYTES) if stream else b""
    return io.StringIO(data.decode("utf-8", errors="replace"))
