"""file.content: a remote file with exactly this content and mode, written atomically."""

from __future__ import annotations

import base64
import difflib
import hashlib
import shlex
from dataclasses import dataclass

from ..command import Command, shell_path
from .base import HostContext, Plan, Step, StepFailed, Upload, register


@dataclass(frozen=True)
class FileContentArgs:
    path: str
    content: str
    mode: str = "0644"


@dataclass(frozen=True)
class FileRead(Command):
    """file_state()'s command, knowing its file (a test's stand-in for a node keeps files by path)."""

    path: str = ""


@dataclass(frozen=True)
class FileWrite(Command):
    """write_command()'s command, knowing its file and mode; the content is its stdin."""

    path: str = ""
    mode: str = "0644"


def file_state(path: str) -> FileRead:
    """The read plan_file() makes: the file's permission bits (octal) and its bytes in base64, `@missing`, or
    `@unreadable`. A shell read, so that it joins the play's batch (Step.reads) and the write's exec."""
    return FileRead(f"f={shell_path(path)}; if [ ! -e \"$f\" ]; then echo @missing; "
                   "elif [ ! -r \"$f\" ]; then echo @unreadable; "
                   "else stat -c %a -- \"$f\" && base64 -w 0 -- \"$f\" && echo; fi", path=path)


def plan_file(ctx: HostContext, path: str, content: str, mode: str) -> Plan:
    """The plan that makes the remote file at `path` hold exactly `content` with `mode` (read-only check)."""
    want = content.encode()
    state = ctx.must_read(file_state(path), f"check that {path} can be read").stdout.split()
    if state == ["@unreadable"]:
        raise StepFailed(f"cannot read {path}", f"make it readable by {ctx.host.user or 'the login user'}")
    current = None if state == ["@missing"] else base64.b64decode(state[1]) if len(state) == 2 else b""
    if current == want and state[:1] == [f"{int(mode, 8):o}"]:
        return Plan(f"{path} is up to date")
    diff = unified_diff(ctx.host.name, path, (current or b"").decode(errors="replace"), content)
    reason = "create" if current is None else "update" if current != want else "fix the mode of"
    # The content goes on the write's stdin, not on a command line: the plan shows it as an upload.
    return Plan(f"{reason} {path}", uploads=(Upload(path, mode, len(want)),), diff=diff)


def unified_diff(host: str, path: str, current: str, wanted: str) -> str | None:
    """What --diff shows for a file change on `host`."""
    return "".join(difflib.unified_diff(current.splitlines(keepends=True), wanted.splitlines(keepends=True),
                                        fromfile=f"{host}:{path} (current)", tofile=f"{host}:{path}")) or None


def write_command(path: str, content: str, mode: str) -> FileWrite:
    """Writes `content` (its stdin) to `path` whole or not at all: into a temporary file beside it, which must then
    hold exactly the content's SHA-256 (a connection cut mid-way leaves a short one), chmod, then renamed over the
    old. The temporary file is removed on any failure, a hang-up included."""
    data = content.encode()
    digest = hashlib.sha256(data).hexdigest()
    return FileWrite(
        f"f={shell_path(path)}; d=$(dirname -- \"$f\") && mkdir -p -- \"$d\" && "
        't=$(mktemp -- "$d/.$(basename -- "$f").XXXXXXXX.tmp") || exit 1; '
        "trap 'rm -f -- \"$t\"' EXIT HUP INT TERM; "
        f'cat > "$t" && [ "$(sha256sum < "$t")" = "{digest}  -" ] && chmod {shlex.quote(mode)} -- "$t" && '
        'mv -f -- "$t" "$f" && trap - EXIT',
        stdin=content, path=path, mode=mode,
    )


def write_file(ctx: HostContext, path: str, content: str, mode: str) -> None:
    """Writes the file (write_command) and reads it back in the same exec, for the check after apply()."""
    ctx.apply_then_read([write_command(path, content, mode)], [file_state(path)],
                        f"check that {path} and its folder can be written")


@register
class FileContent(Step):
    name = "file.content"
    Args = FileContentArgs

    def reads(self, ctx: HostContext) -> tuple[Command, ...]:
        return (file_state(self.args.path),)

    def check(self, ctx: HostContext) -> Plan:
        return plan_file(ctx, self.args.path, self.args.content, self.args.mode)

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        write_file(ctx, self.args.path, self.args.content, self.args.mode)

