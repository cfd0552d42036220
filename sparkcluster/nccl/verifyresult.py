"""What one `sparkcluster verify` found: the whole group's verdict and rows, and what each link showed alone."""

from __future__ import annotations

from dataclasses import dataclass, field

from .controlplane import ControlAddress
from .latency import Latency
from .links import LinkMeasure
from .logs import BandwidthRow
from .verdict import Verdict


@dataclass
class VerifyResult:
    backend: str
    verdict: Verdict
    rows: list[BandwidthRow]
    carried_by: dict[str, list[str]] = field(default_factory=dict)  # node -> "iface local -> remote" lines
    twins: dict[str, float | None] = field(default_factory=dict)  # twin label -> busbw alone (None: carried nothing)
    links: list[LinkMeasure] = field(default_factory=list)  # every twin link of the fabric, measured alone
    control_plane: list[ControlAddress] = field(default_factory=list)  # what each node advertises, judged
    topology: str | None = None  # the fabric graph's kind, as discovery found it
    skipped_links: list[str] = field(default_factory=list)  # links that could not be measured, and why
    latency: Latency | None = None  # the whole group's, per call at decode sizes (each link's: LinkMeasure.latency)
