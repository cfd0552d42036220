"""Typed idempotent steps, registered by name (`domain.resource`). The engine's own are declared here and imported
when a playbook names one (base.StepRegistry): `bootstrap` loads no step module its playbook does not name."""

from .base import REGISTRY, HostContext, NoArgs, Plan, Step, StepFailed, declare

declare(f"{__name__}.docker", "docker.group")
declare(f"{__name__}.files", "file.content")
declare(f"{__name__}.packages", "packages.present")
declare(f"{__name__}.shell", "command.run")

__all__ = ["REGISTRY", "HostContext", "NoArgs", "Plan", "Step", "StepFailed"]
