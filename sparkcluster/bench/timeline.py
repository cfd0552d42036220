"""What the client saw of each request, as plain times: the raw material every figure is computed from, so each
method's arithmetic can be tested on synthetic timelines without a server.

`Exchange` is the one record the client (client.py) writes for every request of every method: each streamed
choice as it arrived, the server's usage, and how it ended. A method reads what its arithmetic needs from it:
the closed loop a `RequestTimeline`, llama-benchy its `RequestResult` (methods/llama_benchy/requests.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sse import Usage


@dataclass(frozen=True)
class Chunk:
    """One streamed event that carried a choice: its text (empty when none), its arrival, how many token ids it
    carried (None: none, the server was not asked or sent none) and its finish_reason."""
    text: str
    timestamp: float
    token_ids: int | None = None
    finish_reason: str | None = None

    @property
    def carries_output(self) -> bool:
        """A chunk with a token. Its text may be empty (a byte-level token that ends mid-character is held back)
        while the stream goes on; an empty chunk with finish_reason set may only close the stream (chat does that),
        so it counts only where the server's usage has a token left over for it."""
        return bool(self.text) or self.finish_reason is None


@dataclass
class Exchange:
    """One request as the client saw it. Times are time.perf_counter seconds."""
    start: float
    end: float = 0.0
    chunks: list[Chunk] = field(default_factory=list)
    usages: list[Usage] = field(default_factory=list)  # each usage event, in order (a server sends one)
    status: int = 0  # the HTTP status (0: no answer came)
    refusal: str = ""  # what a server answering other than 200 said (its first 2000 bytes)
    server_error: str | None = None  # an error event mid-stream; the exchange ends at its arrival
    failure: BaseException | None = None  # the connection, the deadline or the stream's shape failed

    @property
    def refused(self) -> bool:
        return self.status not in (0, 200)

    @property
    def usage(self) -> Usage | None:
        return self.usages[-1] if self.usages else None


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
