"""What the client saw of each request, as plain times: the raw material every figure is computed from, so the
arithmetic (stats.py) can be tested on synthetic timelines without a server."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestTimeline:
    """One request. Times are seconds on one monotonic clock (time.perf_counter in the client)."""

    start: float  # just before the request was sent
    end: float  # the stream's end (or the failure)
    token_times: tuple[float, ...] = ()  # arrival of each streamed chunk that carried output
    prompt_tokens: int = 0  # the server's usage
    completion_tokens: int = 0  # the server's usage; chunks are not tokens when a server batches its stream
    usage: bool = True  # False: the server sent no usage, completion_tokens counts chunks instead
    error: str | None = None
    status: int = 0  # the HTTP status of a request the server refused (0: none, or it failed otherwise)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def itl(self) -> float | None:
        """Mean time between output tokens after the first: (last - first chunk) / (tokens - 1). From the
        server's token count, so a chunk carrying several tokens does not look like one slow token."""
        if self.completion_tokens < 2 or len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.completion_tokens - 1)

    def output_events(self) -> list[tuple[float, float]]:
        """(time, tokens) per chunk: the server's token count spread evenly over the chunks that carried it."""
        if not self.token_times:
            return []
        share = self.completion_tokens / len(self.token_times)
        return [(t, share) for t in self.token_times]


@dataclass(frozen=True)
class RunTimeline:
    """One run at one concurrency: C streams, each sending its next request as soon as its last one ended."""

    concurrency: int
    requests: tuple[RequestTimeline, ...]
    # While all C streams were busy: from the run's start to the moment the first stream found no request left.
    # Throughput is measured inside it, so the tail (fewer than C in flight) does not dilute the figure.
    window: tuple[float, float]
