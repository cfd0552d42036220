"""`verify --tune`: NCCL settings chosen by measurement on the user's own cluster (issue 50).

Which setting is fastest depends on the cluster: on two H200s with a host per rank, the best per size beat the
default by 19-51% and no single one won every size (NCCL_PROTO=LL 19% faster at 8 KiB, 82% slower at 512 KiB); on
switchless Spark rings owners found channel and protocol tuning neutral. So each candidate is measured with the
probe at the decode sizes of the model served (hidden size x concurrency x dtype) and at the bandwidth sizes, and
the one that minimises the decode all-reduce time is kept only where it beats the default beyond noise and loses no
more than BUSBW_LOSS of busbw at 64 MiB and above. A choice per size (SizeTable: each decode size's fastest
algorithm-and-protocol pair, for NCCL's tuner plugin) is measured as one more candidate, and kept only where it
also beats the best single setting beyond noise.

Safety first: a candidate's all-reduce must give the right sum (the probe's `sum_ok`) before its time counts, and
NCCL_PROTO=LL128 is never forced (NCCL's maintainers: forcing it can corrupt data silently, NVIDIA/nccl#281, #831).

Here the values (candidates, trials, the table, the choice) and the comm env's tuned block as text; tunerun.py runs
it, tunerplugin.py puts the plugin and the table on the nodes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..node.commtuning import BLOCK_BEGIN as BLOCK_BEGIN
from ..node.commtuning import BLOCK_END as BLOCK_END
from ..node.commtuning import keep_tuning as keep_tuning
from ..node.commtuning import tuned_settings as tuned_settings
from ..node.commtuning import without_tuning as without_tuning
from .latency import at_size, size_words
from .logs import PROBE_RESULT, Lines, _marked_json, split_lines

NOISE = 0.05  # a candidate must beat the default's decode time by more than this to be chosen
BUSBW_LOSS = 0.10  # ... and lose no more than this of busbw at BANDWIDTH_FLOOR_BYTES and above
BANDWIDTH_FLOOR_BYTES = 64 << 20
BANDWIDTH_SIZES = "64M,256M"
GLOO_BANDWIDTH_SIZES = "1M,4M"  # gloo on the simulator's CPUs: seconds, not minutes
DEFAULT_CONCURRENCY = (1, 8)
NEVER_FORCED = {"NCCL_PROTO": "LL128"}


@dataclass(frozen=True)
class Candidate:
    """A named set of NCCL variables (none: NCCL's defaults, as the comm env has them)."""

    name: str
    env: tuple[tuple[str, str], ...] = ()

    @property
    def settings(self) -> dict[str, str]:
        return dict(self.env)


DEFAULT = Candidate("default")
_COMMON = (
    Candidate("LL protocol", (("NCCL_PROTO", "LL"),)),
    Candidate("Simple protocol", (("NCCL_PROTO", "Simple"),)),
    Candidate("Ring algorithm", (("NCCL_ALGO", "Ring"),)),
    Candidate("Tree algorithm", (("NCCL_ALGO", "Tree"),)),
    Candidate("2 channels", (("NCCL_MAX_NCHANNELS", "2"), ("NCCL_MIN_NCHANNELS", "2"))),
    Candidate("4 channels", (("NCCL_MAX_NCHANNELS", "4"), ("NCCL_MIN_NCHANNELS", "4"))),
    Candidate("8 channels", (("NCCL_MAX_NCHANNELS", "8"), ("NCCL_MIN_NCHANNELS", "8"))),
    # the field's "T1aM4": 4 channels and an 8 MiB buffer (368 KB all_reduce 923 -> 410 us on a Spark ring)
    Candidate("4 channels, 8 MiB buffer", (("NCCL_BUFFSIZE", "8388608"), ("NCCL_MAX_NCHANNELS", "4"),
                                          ("NCCL_MIN_NCHANNELS", "4"))),
)
# An algorithm and a protocol together: what a tuner plugin's table line names (it may not set only one), so each
# size's best pair is known when a choice per size is put together (size_table).
PAIRS = tuple(Candidate(f"{algo} + {proto}", (("NCCL_ALGO", algo), ("NCCL_PROTO", proto)))
              for algo in ("Ring", "Tree") for proto in ("LL", "Simple"))
_BY_TRANSPORT = {
    "socket": (Candidate("4 sockets x 2 threads", (("NCCL_NSOCKS_PERTHREAD", "4"), ("NCCL_SOCKET_NTHREADS", "2"))),),
    "ib": (Candidate("2 QPs per connection", (("NCCL_IB_QPS_PER_CONNECTION", "2"),)),),
}

TUNER_PLUGIN_ENV = ("NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE")  # a choice per size: the plugin and its table
# Every variable a candidate may set: what a comm env difference between two bench runs can owe to verify --tune.
TUNED_VARIABLES = frozenset([*(key for c in (*_COMMON, *PAIRS, *(c for cs in _BY_TRANSPORT.values() for c in cs))
                               for key, _ in c.env), *TUNER_PLUGIN_ENV])


class RefusedSetting(ValueError):
    """A setting verify --tune never forces."""


def refuse_unsafe(env: Mapping[str, str]) -> None:
    """RefusedSetting where `env` forces what can corrupt data silently (NCCL_PROTO=LL128)."""
    for key, value in NEVER_FORCED.items():
        if value.lower() in (v.strip().lower() for v in env.get(key, "").split(",")):
            raise RefusedSetting(f"{key}={env[key]} is never forced: NCCL's maintainers say a forced LL128 can "
                                 "corrupt data silently where its conditions are not met (NVIDIA/nccl#281, #831)")


def candidates(transport: str, comm_env: Mapping[str, str]) -> list[Candidate]:
    """The default first, then what applies to `transport` ("ib", "socket", or another: the common ones only),
    leaving out any candidate that would change a variable the comm env already sets (bootstrap's NCCL_ALGO=Ring on
    a switchless ring is a requirement there, not a preference)."""
    found = [DEFAULT]
    for c in (*_COMMON, *PAIRS, *_BY_TRANSPORT.get(transport, ())):
        refuse_unsafe(c.settings)
        if not any(key in comm_env for key, _ in c.env):
            found.append(c)
    return found


def trial_of(candidate: Candidate, output: Lines) -> Trial | None:
    """The candidate's trial from the probe's output (rank 0's SPARKCLUSTER_PROBE_RESULT line): all_reduce's
    latency rows and bandwidth rows. A row without `sum_ok` (an older probe) counts as unchecked, so as wrong: no
    time counts unchecked. None where the output holds no result."""
    doc = None
    for line in split_lines(output):
        doc = _marked_json(line, PROBE_RESULT) or doc
    if doc is None:
        return None
    latency = [r for r in doc.get("latency") or () if isinstance(r, dict) and r.get("op") == "all_reduce"]
    rows = [r for r in doc.get("rows") or () if isinstance(r, dict) and r.get("op") == "all_reduce"]
    try:
        return Trial(candidate, {int(r["size_bytes"]): float(r["median_us"]) for r in latency},
                     {int(r["size_bytes"]): float(r["busbw_gbps"]) for r in rows},
                     bool(latency) and all(r.get("sum_ok") is True for r in latency))
    except (KeyError, TypeError, ValueError):
        return None


def decode_sizes(hidden_size: int, concurrencies: Sequence[int], dtype_bytes: int = 2) -> dict[int, int]:
    """Concurrency -> the bytes of one decode all-reduce: every running sequence adds one token's hidden state."""
    if hidden_size < 1 or dtype_bytes < 1 or not concurrencies or min(concurrencies) < 1:
        raise ValueError("hidden size, dtype bytes and every concurrency must be positive")
    return {c: hidden_size * c * dtype_bytes for c in sorted(set(concurrencies))}


PER_SIZE_NAME = "per size (tuner plugin)"


@dataclass(frozen=True)
class SizeTable:
    """A choice per message size for NCCL's tuner plugin: (first byte, last byte, pair) lines, written in the CSV
    format of NCCL's example tuner plugin, which nccl/tuner/sizes_tuner.c reads (NCCL_TUNER_CONFIG_FILE)."""

    lines: tuple[tuple[int, int, Candidate], ...]

    def csv(self) -> str:
        rows = ["# sparkcluster verify --tune: all_reduce's algorithm and protocol per message size, as measured",
                "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks"]
        rows += [f"allreduce,{lo},{hi},{pair.settings['NCCL_ALGO'].lower()},{pair.settings['NCCL_PROTO'].lower()},"
                 "-1,-1,-1" for lo, hi, pair in self.lines]
        return "\n".join(rows) + "\n"

    def describe(self) -> str:
        words, reached = [], 0
        for lo, hi, pair in self.lines:
            if lo > reached:  # a gap: NCCL's own choice was fastest there
                words.append(f"NCCL's own choice up to {lo / 1024:,.0f} KiB")
            words.append(f"{pair.name} up to {(hi + 1) / 1024:,.0f} KiB")
            reached = hi + 1
        return ", ".join(words) + ", NCCL's own choice above"

    @property
    def digest(self) -> str:
        """The table's content, short: its file's name on the nodes, so a record or a receipt naming the file names
        the table, and writing another (--check) never changes the one a comm env already points at."""
        return hashlib.sha256(self.csv().encode()).hexdigest()[:12]

    def candidate(self, plugin: str, folder: str) -> Candidate:
        """The table as a candidate: the plugin and the table's path on the nodes, measured like any other."""
        return Candidate(PER_SIZE_NAME, (("NCCL_TUNER_CONFIG_FILE", f"{folder}/sizes-{self.digest}.csv"),
                                         ("NCCL_TUNER_PLUGIN", plugin)))


def size_table(trials: Sequence[Trial], decode: Mapping[int, int]) -> SizeTable | None:
    """Each decode size's fastest algorithm-and-protocol pair (its sum right), as a table; no line where NCCL's own
    choice (the default's run) was faster than every pair, and None where that leaves none or no pair ran.
    A line reaches from the geometric middle between two decode sizes to the next, the largest's to twice its size
    (a batch a little larger than asked), and above it NCCL's own choice stands: the bandwidth sizes keep theirs.
    So a table pays even where one pair wins every decode size: on one H200 with a host per rank, Ring + LL was 24%
    faster at the decode sizes and lost 74% busbw at 64 MiB as a single setting, refused; below 128 KiB alone it
    costs the large messages nothing."""
    pairs = [t for t in trials if (t.candidate in PAIRS or t.candidate == DEFAULT) and t.sum_ok]
    sizes = sorted(set(decode.values()))
    best: list[Candidate] = []
    for size in sizes:
        timed = [(us, t.candidate) for t in pairs if (us := at_size(t.latency_us, size)) is not None]
        if not any(c != DEFAULT for _, c in timed):
            return None
        best.append(min(timed, key=lambda e: e[0])[1])
    starts = [0, *(math.isqrt(a * b) + 1 for a, b in zip(sizes, sizes[1:], strict=False))]
    ends = [*(start - 1 for start in starts[1:]), 2 * sizes[-1]]
    lines: list[tuple[int, int, Candidate]] = []
    for start, end, pair in zip(starts, ends, best, strict=True):
        if pair == DEFAULT:
            continue  # NCCL's own choice was fastest here: no line, so it stays
        if lines and lines[-1][2] == pair and lines[-1][1] == start - 1:
            lines[-1] = (lines[-1][0], end, pair)
        else:
            lines.append((start, end, pair))
    return SizeTable(tuple(lines)) if lines else None


@dataclass(frozen=True)
class Trial:
    """One candidate measured: all_reduce's median per call (us) by size, busbw (GB/s) by size, and whether every
    checked all_reduce gave the right sum."""

    candidate: Candidate
    latency_us: Mapping[int, float]
    busbw_gbps: Mapping[int, float]
    sum_ok: bool

    def decode_us(self, decode: Mapping[int, int]) -> float | None:
        """The decode all-reduces' time summed over the concurrencies asked for; None where a size was not timed."""
        times = [at_size(self.latency_us, size) for size in decode.values()]
        return None if any(t is None for t in times) else sum(t for t in times if t is not None)


@dataclass(frozen=True)
class Line:
    """One candidate's figures against the default's."""

    name: str
    decode_us: float | None
    change: float | None  # fraction faster (+) or slower (-) than the default's decode time
    busbw_change: float | None  # fraction of busbw lost (+) at BANDWIDTH_FLOOR_BYTES and above, the worst size
    verdict: str


@dataclass(frozen=True)
class Choice:
    chosen: Candidate
    reason: str
    lines: tuple[Line, ...]
    default_us: float | None
    chosen_us: float | None

    @property
    def changes_anything(self) -> bool:
        return self.chosen != DEFAULT


def noise_of(first: Trial, again: Trial | None, decode: Mapping[int, int]) -> float:
    """The noise a candidate must beat: NOISE, or more where the default measured twice (first and last) differed
    by more at the decode sizes (one H200 with two ranks over sockets: 4-20% from one run to the next)."""
    if again is None:
        return NOISE
    a, b = first.decode_us(decode), again.decode_us(decode)
    if a is None or b is None or a <= 0:
        return NOISE
    return max(NOISE, abs(b - a) / a)


def choose(trials: Sequence[Trial], decode: Mapping[int, int], *, backend: str = "nccl", noise: float = NOISE,
           busbw_loss: float = BUSBW_LOSS) -> Choice:
    """The candidate with the least decode all-reduce time that gives the right sum, loses no more than
    `busbw_loss` of busbw at 64 MiB and above, and beats the default beyond `noise`; else the default, saying why.
    Under gloo NCCL's variables change nothing: the default stays whatever the spread."""
    default = next((t for t in trials if t.candidate == DEFAULT), None)
    if default is None or not default.sum_ok:
        raise ValueError("the default setting must be measured first, with the right sum")
    base = default.decode_us(decode)
    if base is None:
        raise ValueError("the default's run timed none of the decode sizes: "
                         + ", ".join(size_words(s) for s in decode.values()))
    lines, eligible = [], []
    for trial in trials:
        mine = trial.decode_us(decode)
        change = None if mine is None else (base - mine) / base
        lost = _busbw_lost(trial, default)
        if trial.candidate == DEFAULT:
            verdict = "the default"
        elif _unsafe(trial.candidate):
            verdict = "never forced (LL128 can corrupt data silently)"
        elif not trial.sum_ok:
            verdict = "wrong sum: refused, its time not counted"
        elif mine is None or change is None:
            verdict = "not timed at every decode size"
        elif lost is not None and lost > busbw_loss:
            verdict = f"loses {lost:.0%} busbw at {size_words(BANDWIDTH_FLOOR_BYTES)} and above"
        elif change <= noise:
            verdict = "no faster beyond noise" if change > -noise else "slower"
        else:
            verdict = "faster"
            eligible.append((mine, trial))
        lines.append(Line(trial.candidate.name, mine, change, lost, verdict))
    if backend == "gloo":
        return Choice(DEFAULT, "gloo carries this cluster's collectives (CPU), where NCCL's settings change nothing: "
                      "the default stays, and the candidates' spread is noise", tuple(lines), base, base)
    if not eligible:
        return Choice(DEFAULT, f"no candidate beats the default's decode all-reduce time by more than {noise:.0%} "
                      f"within {busbw_loss:.0%} of its busbw: the default stays", tuple(lines), base, base)
    best_us, best = min(eligible, key=lambda e: e[0])
    singles = [(us, t) for us, t in eligible if t.candidate.name != PER_SIZE_NAME]
    if best.candidate.name == PER_SIZE_NAME and singles:
        # the table must beat the best single setting beyond noise too: it costs a plugin in every serve's NCCL
        single_us, single = min(singles, key=lambda e: e[0])
        if (single_us - best_us) / single_us <= noise:
            lines = [Line(l.name, l.decode_us, l.change, l.busbw_change,
                          f"no faster than {single.candidate.name} beyond noise" if l.name == PER_SIZE_NAME
                          else l.verdict) for l in lines]
            best_us, best = single_us, single
    final = tuple(Line(l.name, l.decode_us, l.change, l.busbw_change, "chosen" if l.name == best.candidate.name
                       else l.verdict) for l in lines)
    return Choice(best.candidate, f"{best.candidate.name}: decode all-reduces {base:.1f} -> {best_us:.1f} us "
                  f"({(base - best_us) / base:.0%} faster) within {busbw_loss:.0%} of the default's busbw", final,
                  base, best_us)


def _unsafe(candidate: Candidate) -> bool:
    try:
        refuse_unsafe(candidate.settings)
    except RefusedSetting:
        return True
    return False


def _busbw_lost(trial: Trial, default: Trial) -> float | None:
    """The worst fraction of the default's busbw lost at BANDWIDTH_FLOOR_BYTES and above; None where neither ran
    such a size."""
    losses = [(d - trial.busbw_gbps[s]) / d for s, d in default.busbw_gbps.items()
              if s >= BANDWIDTH_FLOOR_BYTES and s in trial.busbw_gbps and d > 0]
    return max(losses) if losses else None


# ---- the comm env's tuned block (text in, text out) ----------------------------------------------------------------
def with_tuning(text: str, choice: Choice, at: str) -> str:
    """The comm env with `choice`'s variables in verify --tune's block (replacing an earlier one); the default
    leaves no block. Variables the rest of the file sets are never overridden (candidates() leaves them out)."""
    base = without_tuning(text)
    if not choice.changes_anything:
        return base
    refuse_unsafe(choice.chosen.settings)
    lines = [BLOCK_BEGIN, f"# {at}: {choice.reason}",
             *(f"{key}={value}" for key, value in choice.chosen.env), BLOCK_END]
    return base + ("" if not base or base.endswith("\n") else "\n") + "\n".join(lines) + "\n"
