"""models.stage: the inventory's `models:` on every node (run on the head; staging works across nodes).

check() scans every node's copy (read-only); apply() runs the same staging as `sparkcluster stage`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.errors import SparkclusterError
from ..engine.modelref import ModelRef
from ..engine.session import Session
from ..engine.steps.base import HostContext, Plan, Step, StepFailed, register


@dataclass(frozen=True)
class ModelsArgs:
    models: tuple[str, ...] = ()


@register
class ModelsStage(Step):
    name = "models.stage"
    Args = ModelsArgs

    def _cluster(self, ctx: HostContext) -> Session:
        # Only the nodes still in the run: a failed node is not a destination.
        return ctx.session.only(ctx.all_facts)

    def check(self, ctx: HostContext) -> Plan:
        if not self.args.models:
            return Plan("no models listed in the inventory", skip=True)
        # The stager (its wire, chains, hashing) is imported only when there is a model to stage: a bootstrap of an
        # inventory without models costs none of it.
        from .hfcache import source_manifest
        from .stager import Stager
        inventory = self._cluster(ctx)
        todo: list[str] = []  # notes, not commands: apply() stages through the Stager, across the nodes
        for text in self.args.models:
            model = ModelRef.parse(text)
            stager = Stager(inventory, model)
            stager.scan()
            holders = [n for n, s in stager.scans.items() if source_manifest(model, s)]
            if not holders:
                todo.append(f"download {model} on {inventory.head.name}, then stage it to every node")
                continue
            _, manifest = stager.choose_source("auto")
            lacking = [n for n, s in stager.statuses(manifest).items() if not s.complete]
            if lacking:
                todo.append(f"stage {model} to {', '.join(lacking)} over the fabric")
        if not todo:
            return Plan(f"every node holds {', '.join(self.args.models)}")
        return Plan(f"stage {len(todo)} model(s)", notes=tuple(todo))

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        from .stager import stage

        inventory = self._cluster(ctx)
        for text in self.args.models:
            try:
                result = stage(inventory, ModelRef.parse(text))
            except SparkclusterError as e:
                raise StepFailed(f"staging {text}: {e.message}", e.fix) from None
            failed = {n: r for n, r in result.nodes.items() if r.state != "complete"}
            if failed:
                name, r = next(iter(failed.items()))
                raise StepFailed(f"staging {text} failed on {', '.join(failed)}: {r.error}", r.fix)
