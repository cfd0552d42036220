"""`top` behind a router: each replica's own /metrics, one GET each per interval, all at once.

The router's /metrics is no view of the endpoint: vllm-router hands that GET to one replica in turn, so two
scrapes in a row may read two engines' counters, and one replica's load, queue and preemptions stay invisible.
Each replica is read where it answers itself, with its own previous reading for the rates, and the endpoint's
figures are the replicas' summed (scrape.summed). A replica that does not answer is shown as such; the others go on.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from .scrape import EndpointFigures, Reading, fetch, figures

# How long one interval waits on the replicas' GETs: a scrape on the LAN takes milliseconds. A GET still running then
# (each is bounded at scrape.SCRAPE_TIMEOUT_S) goes on in the background and is shown when it ends.
WAIT_S = 1.0


@dataclass(frozen=True)
class ReplicaTarget:
    """One engine behind the router: its index, its nodes in rank order, and where its own /metrics answers."""

    index: int
    nodes: tuple[str, ...]
    metrics_url: str

    @property
    def name(self) -> str:
        """Its head node (rank 0, the one that answers HTTP): no two replicas share a node."""
        return self.nodes[0]

    @property
    def label(self) -> str:
        return f"replica {self.index} on {self.name}"  # as `status` names a replica


@dataclass(frozen=True)
class ReplicaView:
    target: ReplicaTarget
    figures: EndpointFigures | None = None
    error: str | None = None  # why its /metrics gave nothing this interval

    def to_json(self) -> dict[str, Any]:
        return {"name": self.target.name, "index": self.target.index, "nodes": list(self.target.nodes),
                "metrics_url": self.target.metrics_url, "error": self.error,
                "figures": None if self.figures is None else self.figures.to_json()}


class ReplicaScraper:
    """Scrapes every replica in parallel, waiting at most WAIT_S: one that takes longer is shown as not answering and
    is not asked again until its GET ends, so a hung replica neither stalls the view of the others beyond WAIT_S
    nor piles up requests on itself."""

    def __init__(self, targets: Sequence[ReplicaTarget]) -> None:
        self.targets = tuple(targets)
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(self.targets)), thread_name_prefix="top-scrape")
        self.in_flight: dict[int, Future[Reading]] = {}
        self.previous: dict[int, Reading] = {}  # each replica's last answer: its rates cover the time since

    def read(self) -> tuple[ReplicaView, ...]:
        for target in self.targets:
            if target.index not in self.in_flight:
                self.in_flight[target.index] = self.pool.submit(fetch, target.metrics_url)
        wait(list(self.in_flight.values()), timeout=WAIT_S)
        return tuple(self._view(target) for target in self.targets)

    def _view(self, target: ReplicaTarget) -> ReplicaView:
        future = self.in_flight[target.index]
        if not future.done():
            return ReplicaView(target, error=f"/metrics did not answer within {WAIT_S:g} s")
        del self.in_flight[target.index]
        reading = future.result()  # fetch turns every failure into the reading's error
        if reading.scrape is None:
            return ReplicaView(target, error=reading.error)
        view = ReplicaView(target, figures(reading.scrape, self.previous.get(target.index), reading.at))
        self.previous[target.index] = reading
        return view

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
