"""hfcache.dir: the Hugging Face cache exists on every node and belongs to the login user.

Containers that download as root leave root-owned files that later break rsync and offline loads
(docs/failure-modes.md F14); they are given back. The path is resolved on the node itself.
"""

from __future__ import annotations

from ...engine.command import Command
from ...engine.remote import HF_HOME
from ...engine.steps.base import HostContext, NoArgs, Plan, Step, StepFailed, register

# One read: the path, the login user's uid and gid, then the first entries not theirs (or @missing).
STATE = (f'p="{HF_HOME}"; u=$(id -u) && g=$(id -g) || exit 1; printf "%s\\n" "$p" "$u" "$g"; '
         'if [ -d "$p" ]; then find "$p" ! -user "$u" -print 2>/dev/null | head -n 3; else echo @missing; fi')


@register
class HfCacheDir(Step):
    name = "hfcache.dir"
    Args = NoArgs
    fix = "check the disk and the path in HF_HOME on the node"

    def reads(self, ctx: HostContext) -> tuple[Command, ...]:
        return (Command(STATE),)

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        ctx.apply_then_read(plan.commands, self.reads(ctx), self.fix)  # the check after it: no round trip of its own

    def check(self, ctx: HostContext) -> Plan:
        lines = ctx.must_read(Command(STATE), self.fix).stdout.splitlines()
        if len(lines) < 3 or not lines[0].startswith("/"):
            raise StepFailed(f"could not resolve the HF cache path on {ctx.host.name}: {lines!r}")
        path, uid, gid, state = lines[0], lines[1], lines[2], lines[3:]
        if state == ["@missing"]:
            return Plan(f"create {path}", (Command.argv(["mkdir", "-p", "--", path]),))
        if state:
            shown = ", ".join(state)
            return Plan(f"give {path} back to uid {uid} (not theirs: {shown}...)",
                        (Command.argv(["chown", "-R", f"{uid}:{gid}", "--", path], sudo=True),))
        return Plan(f"{path} exists and belongs to uid {uid}")
