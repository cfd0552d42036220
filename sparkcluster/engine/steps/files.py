"""file.content: a remote file with exactly this content and mode, written atomically."""

from __future__ import annotations

import difflib
import posixpath
from dataclasses import dataclass

from ..command import Command, shell_path
from ..transport import remote_path
from .base import HostContext, Plan, Step, StepFailed, Upload, register


@dataclass(frozen=True)
class FileContentArgs:
    path: str
    content: str
    mode: str = "0644"


def plan_file(ctx: HostContext, path: str, content: str, mode: str) -> Plan:
    """The plan that makes the remote file at `path` hold exactly `content` with `mode` (read-only check)."""
    remote, want = remote_path(path), content.encode()
    try:
        current = ctx.transport.read_file(remote)
    except PermissionError:
        raise StepFailed(f"cannot read {path}", f"make it readable by {ctx.host.user or 'the login user'}") from None
    if current == want and _mode(ctx, remote) == int(mode, 8):
        return Plan(f"{path} is up to date")
    diff = unified_diff(ctx.host.name, path, (current or b"").decode(errors="replace"), content)
    reason = "create" if current is None else "update" if current != want else "fix the mode of"
    # write_file() writes through SFTP: the plan shows that upload, not a shell line that would never run.
    return Plan(f"{reason} {path}", uploads=(Upload(path, mode, len(want)),), diff=diff)


def unified_diff(host: str, path: str, current: str, wanted: str) -> str | None:
    """What --diff shows for a file change on `host`."""
    return "".join(difflib.unified_diff(current.splitlines(keepends=True), wanted.splitlines(keepends=True),
                                        fromfile=f"{host}:{path} (current)", tofile=f"{host}:{path}")) or None


def write_file(ctx: HostContext, path: str, content: str, mode: str) -> None:
    remote = remote_path(path)
    parent = posixpath.dirname(remote)
    if parent:
        ctx.must(Command(f"mkdir -p -- {shell_path(path.rsplit('/', 1)[0])}"), f"check that {parent} can be created")
    ctx.transport.write_file_atomic(remote, content.encode(), int(mode, 8))


@register
class FileContent(Step):
    name = "file.content"
    Args = FileContentArgs

    def check(self, ctx: HostContext) -> Plan:
        return plan_file(ctx, self.args.path, self.args.content, self.args.mode)

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        write_file(ctx, self.args.path, self.args.content, self.args.mode)


def _mode(ctx: HostContext, path: str) -> int | None:
    try:
        mode = ctx.transport.sftp().stat(path).st_mode
        return None if mode is None else mode & 0o7777  # None: a server that does not say
    except FileNotFoundError:
        return None
