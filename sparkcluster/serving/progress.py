"""What `up` and `serve` report while they work: typed events through one `emit`, rendered by `render.py`.
Staging's and image sync's own progress (`BlobDone`, `ImageBytes`) travel on the same stream, so `serve` shows
a model's copy and an image's per node exactly as `stage` and `image sync` do."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..nccl.verdict import Verdict
from ..staging.chain import BlobDone
from ..staging.images import ImageBytes


@dataclass(frozen=True)
class PhaseStarted:
    phase: str  # image, stage, ray, verify, launch, ready


@dataclass(frozen=True)
class ProbeJudged:
    backend: str
    verdict: Verdict


ServeEvent = PhaseStarted | ProbeJudged | ImageBytes | BlobDone
Emit = Callable[[ServeEvent], None]


def ignore(event: ServeEvent) -> None:
    """The emit of a command whose output is one JSON document at the end."""
