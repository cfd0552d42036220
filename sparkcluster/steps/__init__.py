"""Typed idempotent steps, registered by name (`domain.resource`)."""

from . import commands, files, packages  # noqa: F401  (importing registers them)
from .base import REGISTRY, HostContext, Plan, Step, StepFailed

__all__ = ["REGISTRY", "HostContext", "Plan", "Step", "StepFailed"]
