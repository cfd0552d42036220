"""hfcache.dir: the Hugging Face cache exists on every node and belongs to the login user.

Containers that download as root leave root-owned files that later break rsync and offline loads
(docs/failure-modes.md F14); they are given back. The path is resolved on the node itself.
"""

from __future__ import annotations

import shlex

from ...engine.command import Command
from ...engine.remote import HF_HOME
from ...engine.steps.base import HostContext, NoArgs, Plan, Step, StepFailed, register

RESOLVE = f'printf "%s\\n" "{HF_HOME}"; id -u; id -g'


@register
class HfCacheDir(Step):
    name = "hfcache.dir"
    Args = NoArgs
    fix = "check the disk and the path in HF_HOME on the node"

    def check(self, ctx: HostContext) -> Plan:
        lines = ctx.must(Command(RESOLVE), self.fix).stdout.splitlines()
        if len(lines) < 3 or not lines[0].startswith("/"):
            raise StepFailed(f"could not resolve the HF cache path on {ctx.host.name}: {lines!r}")
        path, uid, gid = lines[0], lines[1], lines[2]
        quoted = shlex.quote(path)
        state = ctx.run(Command(
            f"if [ -d {quoted} ]; then find {quoted} ! -user {uid} -print 2>/dev/null | head -n 3; "
            f"else echo @missing; fi")).stdout.splitlines()
        if state == ["@missing"]:
            return Plan(f"create {path}", (Command.argv(["mkdir", "-p", "--", path]),))
        if state:
            shown = ", ".join(state)
            return Plan(f"give {path} back to uid {uid} (not theirs: {shown}...)",
                        (Command.argv(["chown", "-R", f"{uid}:{gid}", "--", path], sudo=True),))
        return Plan(f"{path} exists and belongs to uid {uid}")
