"""Typed idempotent steps, registered by name (`domain.resource`)."""

from . import docker, files, packages, shell  # noqa: F401 (registers)
from .base import REGISTRY, HostContext, NoArgs, Plan, Step, StepFailed

__all__ = ["REGISTRY", "HostContext", "NoArgs", "Plan", "Step", "StepFailed"]
