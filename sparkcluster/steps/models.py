"""models.check: the hook where staging of the inventory's `models:` plugs in (the staging issue).

Today it reports, per node, which listed models already have a complete-looking snapshot in the node's
own HF cache, and warns about the others. It changes nothing.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .base import HostContext, Plan, Step, register
from ..command import Command


def cache_dir_name(model: str) -> str:
    """`Qwen/Qwen3-0.6B@main` -> `models--Qwen--Qwen3-0.6B` (Hugging Face's cache layout)."""
    return "models--" + model.split("@", 1)[0].replace("/", "--")


@dataclass(frozen=True)
class ModelsArgs:
    models: tuple[str, ...] = ()


@register
class ModelsCheck(Step):
    name = "models.check"
    Args = ModelsArgs

    def check(self, ctx: HostContext) -> Plan:
        if not self.args.models:
            return Plan("no models listed in the inventory", skip=True)
        probes = " ".join(
            f'[ -s "$hub"/{shlex.quote(cache_dir_name(m))}/refs/main ] && echo {shlex.quote(m)};'
            for m in self.args.models)
        out = ctx.run(Command(f'hub="${{HF_HOME:-$HOME/.cache/huggingface}}/hub"; {probes} true')).stdout
        present = set(out.split())
        missing = [m for m in self.args.models if m not in present]
        warnings = tuple(f"{m} is not in this node's HF cache yet; stage it before serving" for m in missing)
        return Plan(f"{len(present)} of {len(self.args.models)} models present", warnings=warnings)
