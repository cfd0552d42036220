"""file.content: a remote file with exactly this content and mode, written atomically."""

from __future__ import annotations

import difflib
import posixpath
from dataclasses import dataclass

from .base import HostContext, Plan, Step, StepFailed, register
from ..command import Command


def remote_path(path: str) -> str:
    """`~/x` -> `x`: SFTP resolves relative paths in the login user's home, on the remote host itself."""
    return path[2:] if path.startswith("~/") else path


@dataclass(frozen=True)
class FileContentArgs:
    path: str
    content: str
    mode: str = "0644"


@register
class FileContent(Step):
    name = "file.content"
    Args = FileContentArgs

    def check(self, ctx: HostContext) -> Plan:
        path, want = remote_path(self.args.path), self.args.content.encode()
        try:
            current = ctx.transport.read_file(path)
        except PermissionError:
            raise StepFailed(f"cannot read {self.args.path}", f"make it readable by {ctx.host.user or 'the login user'}")
        mode = int(self.args.mode, 8)
        if current == want and _mode(ctx, path) == mode:
            return Plan(f"{self.args.path} is up to date")
        diff = "".join(difflib.unified_diff(
            (current or b"").decode(errors="replace").splitlines(keepends=True),
            self.args.content.splitlines(keepends=True),
            fromfile=f"{ctx.host.name}:{self.args.path} (current)", tofile=f"{ctx.host.name}:{self.args.path}",
        ))
        reason = "create" if current is None else "update" if current != want else "fix the mode of"
        # Shown in --check; apply() writes through SFTP rather than running this line.
        shown = Command.argv(["install", "-m", self.args.mode, "/dev/stdin", self.args.path])
        return Plan(f"{reason} {self.args.path}", (shown,), diff=diff or None)

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        path = remote_path(self.args.path)
        parent = posixpath.dirname(path)
        if parent:
            ctx.must(Command.argv(["mkdir", "-p", "--", parent]), f"check that {parent} can be created")
        ctx.transport.write_file_atomic(path, self.args.content.encode(), int(self.args.mode, 8))


def _mode(ctx: HostContext, path: str) -> int | None:
    try:
        return ctx.transport.sftp().stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None
