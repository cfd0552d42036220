"""gpu.clock_cap: the GPU clock capped now and at every boot (node/gpuclock.py says why and how it is proved), opt-in
by `bootstrap --gpu-clock-cap MHZ` or `gpu_clock_cap:` in the inventory's vars.

Three things converge, each read in check(): the oneshot unit's file (written atomically, as root), its enablement
(the symlink `systemctl enable` makes, made directly so that no running systemd is needed), and the cap in force this
boot (the unit's mark in /run naming it, and the graphics clock at or under it)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...engine.command import Command
from ...engine.steps.base import HostContext, Plan, Step, StepFailed, register
from ...engine.steps.files import file_state, plan_file, write_command
from ..gpuclock import (
    CLOCK_QUERY,
    MARK_PATH,
    MAX_CAP_MHZ,
    MIN_CAP_MHZ,
    UNIT_NAME,
    UNIT_PATH,
    WANTS_LINK,
    apply_line,
    lock_value,
    parse_clock_report,
    unit_text,
)

CLOCKS = Command(CLOCK_QUERY, timeout=30)
ENABLED = Command(f"readlink {WANTS_LINK} || true")
MARK = Command(f"cat {MARK_PATH} 2>/dev/null || true")
ENABLE = Command(f"mkdir -p {WANTS_LINK.rsplit('/', 1)[0]} && ln -sfn {UNIT_PATH} {WANTS_LINK}", sudo=True)
NOT_ASKED = "no GPU clock cap asked (--gpu-clock-cap MHZ, or gpu_clock_cap: in the inventory's vars)"


@dataclass(frozen=True)
class GpuClockArgs:
    cap_mhz: int = 0  # 0: no cap asked


@register
class GpuClockCap(Step):
    name = "gpu.clock_cap"
    Args = GpuClockArgs
    fix = "the login user needs sudo for nvidia-smi -lgc and /etc/systemd/system (or run bootstrap with --become)"

    def reads(self, ctx: HostContext) -> tuple[Command, ...]:
        return (CLOCKS, file_state(UNIT_PATH), ENABLED, MARK) if self.args.cap_mhz else ()

    def check(self, ctx: HostContext) -> Plan:
        cap = self.args.cap_mhz
        if not cap:
            return Plan(NOT_ASKED, skip=True)
        if not MIN_CAP_MHZ <= cap <= MAX_CAP_MHZ:
            raise StepFailed(f"a GPU clock cap of {cap} MHz is outside {MIN_CAP_MHZ}-{MAX_CAP_MHZ} MHz",
                             "give the cap in MHz, e.g. --gpu-clock-cap 2000 (the field's)")
        report = ctx.read(CLOCKS)
        if not report.ok:
            raise StepFailed(f"`{CLOCK_QUERY}` exited {report.exit_code}: {report.stderr_tail(1) or report.stdout.strip()}",
                             "nvidia-smi must answer on the node: check the NVIDIA driver (preflight.gpu)", report)
        clocks = parse_clock_report(report.stdout)
        if clocks.max_graphics is not None and cap >= clocks.max_graphics:
            raise StepFailed(f"a GPU clock cap of {cap} MHz is at or above this GPU's maximum graphics clock "
                             f"({clocks.max_graphics} MHz): it would cap nothing",
                             "give a lower --gpu-clock-cap (the field's is 2000)")
        unit = plan_file(ctx, UNIT_PATH, unit_text(cap), "0644")
        enabled = ctx.read(ENABLED).stdout.strip() == UNIT_PATH
        mark = ctx.read(MARK).stdout.strip()
        now = f"graphics clock {clocks.graphics} MHz" if clocks.graphics is not None else "graphics clock N/A"
        why: list[str] = [unit.reason] if unit.changes else []
        commands: list[Command] = []
        if not enabled:
            why.append(f"enable {UNIT_NAME} at boot")
            commands.append(ENABLE)
        if mark != lock_value(cap):
            since = f"{mark} since boot" if mark else "no cap applied since boot"
            why.append(f"cap the GPU clock at {cap} MHz now ({since})")
            commands.append(Command(apply_line(cap), sudo=True, timeout=60))
        elif clocks.graphics is not None and clocks.graphics > cap:
            why.append(f"cap the GPU clock at {cap} MHz again ({now}, above the cap: the lock was reset)")
            commands.append(Command(apply_line(cap), sudo=True, timeout=60))
        if not why:
            return Plan(f"GPU clock capped at {cap} MHz ({now}); {UNIT_NAME} re-applies it at boot")
        return Plan("; ".join(why), commands=tuple(commands), uploads=unit.uploads, diff=unit.diff)

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        cap = self.args.cap_mhz
        # The unit is root's: the atomic write runs under sudo, its content still on stdin, never on a command line.
        write = [replace(write_command(UNIT_PATH, unit_text(cap), "0644"), sudo=True)] if plan.uploads else []
        ctx.apply_then_read([*write, *plan.commands], self.reads(ctx), self.fix)
