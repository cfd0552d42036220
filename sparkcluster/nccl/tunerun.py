"""`verify --tune`'s run: each candidate measured by the probe across the nodes in the comm env vLLM gets, the
choice (tune.py), and where it goes: every node's comm env (so the next serve's vLLM has it; bench's receipts
record that file) and every node's last-verify record. `--check` shows it and changes nothing; `--reset` removes
the tuned block."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from typing import Any

from ..engine.command import Command, shell_path
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.remote import python_line, python_of
from ..engine.session import Session
from ..engine.transport import remote_path
from ..node.fabric import Kind
from ..node.network import choose_for, comm_env_path
from . import tunerplugin
from .lastverify import LAST_VERIFY_PATH
from .latency import size_words
from .proberun import TORCH_CHECK, detect_backend, probe_commands, run_probe
from .servingenv import check_comm_env
from .tune import (
    BANDWIDTH_SIZES,
    GLOO_BANDWIDTH_SIZES,
    PER_SIZE_NAME,
    TUNER_PLUGIN_ENV,
    Candidate,
    Choice,
    Trial,
    candidates,
    choose,
    decode_sizes,
    noise_of,
    size_table,
    trial_of,
    tuned_settings,
    with_tuning,
    without_tuning,
)
from .verify import _fabric, _rendezvous

# A candidate's run: its env on every node -> the probe's output on the head (rank 0). The probe's boundary, where
# the tests put a double that prints what the probe prints.
Measure = Callable[[Candidate], str]

# Tests only: a file on the machine running sparkcluster whose Python runs on every node in the probe's place, with
# the probe's arguments and each candidate's env, and prints the probe's result line with the timings the test
# chose (the simulator's gloo times no NCCL setting, so no candidate could win there). Read from the environment of
# the sparkcluster process alone: a recipe sets the nodes' serving env and vLLM's flags, never this, and nothing
# else in the CLI names it. docs/verify.md says so.
PROBE_DOUBLE_ENV = "SPARKCLUSTER_TEST_PROBE_SCRIPT"


@dataclass(frozen=True)
class TuneResult:
    backend: str
    transport: str
    decode: Mapping[int, int]  # concurrency -> bytes
    choice: Choice | None  # None for --reset
    before: Mapping[str, str]  # the tuned block's variables found before (the head's)
    written: bool
    unmeasured: tuple[str, ...] = field(default=())  # candidates whose run gave no result
    model: str | None = None  # whose decode sizes these are, where --model named it
    table: str | None = None  # the choice per size put together from the pairs' runs (SizeTable.describe)
    table_refused: Mapping[str, str] = field(default_factory=dict)  # node -> why it cannot load the tuner plugin

    def to_json(self) -> dict[str, Any]:
        c = self.choice
        return {"backend": self.backend, "transport": self.transport, "model": self.model,
                "decode_bytes": {str(k): v for k, v in self.decode.items()}, "before": dict(self.before),
                "written": self.written, "unmeasured": list(self.unmeasured),
                "per_size_table": self.table, "per_size_refused": dict(self.table_refused),
                "chosen": None if c is None else {"name": c.chosen.name, "settings": c.chosen.settings,
                                                  "reason": c.reason, "default_us": c.default_us,
                                                  "chosen_us": c.chosen_us},
                "candidates": [] if c is None else [
                    {"name": l.name, "decode_us": l.decode_us, "change": l.change, "busbw_lost": l.busbw_change,
                     "verdict": l.verdict} for l in c.lines]}


def read_comm_envs(session: Session) -> dict[str, str]:
    check_comm_env(session)
    return {h.name: (session.transport(h).read_file(remote_path(comm_env_path(h))) or b"").decode(errors="replace")
            for h in session.hosts}


def run_tune(session: Session, *, hidden_size: int, concurrencies: Sequence[int], dtype_bytes: int = 2,
             backend: str = "auto", check: bool = False, timeout: float = 600, measure: Measure | None = None,
             model: str | None = None) -> TuneResult:
    decode = decode_sizes(hidden_size, concurrencies, dtype_bytes)
    texts = read_comm_envs(session)
    head = session.head
    before = tuned_settings(texts[head.name])
    if backend == "auto":
        backend = detect_backend(session.transport(head), python_line(python_of(head), TORCH_CHECK))
    untuned = {name: _env_lines(without_tuning(text)) for name, text in texts.items()}
    transport = _transport(backend, untuned[head.name])
    tried = candidates(transport, untuned[head.name])
    homes: dict[str, str] = {}  # each node's home, once the tuner plugin is built there (for_host)
    measure = measure or _probe_measure(session, backend, decode, timeout, before, homes)
    trials: list[Trial] = []
    unmeasured = []
    for candidate in tried:
        found = trial_of(candidate, measure(candidate))
        if found is None:
            if candidate == tried[0]:
                raise SparkclusterError("verify --tune: the probe gave no result with NCCL's default settings",
                                        "run `sparkcluster verify` first: it names what stops the probe")
            unmeasured.append(candidate.name)
            continue
        trials.append(found)
    # A choice per size, through the tuner plugin: put together from the pairs' runs, then measured itself.
    # Not where the comm env sets a tuner plugin of its own (the user's): the tuned block never overrides it.
    own_plugin = any(key in untuned[head.name] for key in TUNER_PLUGIN_ENV)
    table = size_table(trials, decode) if backend == "nccl" and not own_plugin else None
    refused: dict[str, str] = {}
    if table is not None:
        per_size = table.candidate(tunerplugin.PLUGIN, tunerplugin.TUNER_DIR)
        installed = tunerplugin.install(session, per_size.settings["NCCL_TUNER_CONFIG_FILE"], table.csv())
        homes.update(installed.homes)
        refused.update(installed.refused)
        found = trial_of(per_size, measure(per_size)) if installed.ok else None
        if found is not None:
            trials.append(found)
        elif installed.ok:
            unmeasured.append(per_size.name)
    # The default once more, last: how far it moved is this cluster's noise, which a winner must beat.
    again = trial_of(tried[0], measure(tried[0])) if len(trials) > 1 else None
    choice = choose(trials, decode, backend=backend, noise=noise_of(trials[0], again, decode))
    at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if not check:
        _write_envs(session, {name: with_tuning(text, _on_node(choice, homes.get(name)), at)
                              for name, text in texts.items()})
        per_size_table = table.describe() if table is not None and choice.chosen.name == PER_SIZE_NAME else None
        _record(session, {"settings": choice.chosen.settings, "name": choice.chosen.name, "reason": choice.reason,
                          "default_us": choice.default_us, "chosen_us": choice.chosen_us,
                          "decode_bytes": {str(k): v for k, v in decode.items()}, "model": model,
                          "per_size_table": per_size_table, "at": at})
    return TuneResult(backend, transport, decode, choice, before, not check, tuple(unmeasured), model,
                      None if table is None else table.describe(), refused)


def _on_node(choice: Choice, home: str | None) -> Choice:
    """The choice as one node's comm env carries it: the tuner plugin's paths in that node's home."""
    if home is None:
        return choice
    chosen = Candidate(choice.chosen.name, tuple(tunerplugin.for_host(choice.chosen.settings, home).items()))
    return dataclasses.replace(choice, chosen=chosen)


def run_reset(session: Session, *, check: bool = False) -> TuneResult:
    """The tuned block removed from every node's comm env (NCCL's defaults again) and from the last-verify record."""
    texts = read_comm_envs(session)
    before = tuned_settings(texts[session.head.name])
    if not check:
        _write_envs(session, {name: without_tuning(text) for name, text in texts.items()})
        _record(session, None)
        session.each(lambda host: session.run(host, Command(tunerplugin.remove_line(), timeout=30)))
    return TuneResult("", "", {}, None, before, not check)


def _env_lines(text: str) -> dict[str, str]:
    return {k: v for line in text.splitlines() if not line.startswith("#") and "=" in line
            for k, _, v in [line.partition("=")]}


def _transport(backend: str, env: Mapping[str, str]) -> str:
    """Which transport's candidates apply: gloo's (none of NCCL's matter), IB where the comm env names HCAs and does
    not disable IB, sockets otherwise."""
    if backend == "gloo":
        return "gloo"
    return "ib" if env.get("NCCL_IB_HCA") and env.get("NCCL_IB_DISABLE") != "1" else "socket"


def _probe_measure(session: Session, backend: str, decode: Mapping[int, int], timeout: float,
                   before: Mapping[str, str], homes: Mapping[str, str]) -> Measure:
    """A candidate's run: the probe on every node in its comm env, the tuned block's variables unset (the default
    is NCCL's, not the last tuning's) and the candidate's set (`~/` paths in each node's home: `homes`)."""
    choices = {h.name: choose_for(h, session.facts[h.name]) for h in session.hosts}
    fabric = _fabric(session)
    master = _rendezvous(session, choices, fabric is not None and fabric.kind is Kind.RING)
    env_files = check_comm_env(session)
    script = _probe_script()
    sizes = GLOO_BANDWIDTH_SIZES if backend == "gloo" else BANDWIDTH_SIZES
    latency = ",".join(str(b) for b in sorted(set(decode.values())))
    args = ["--ops", "all_reduce", "--latency-sizes", latency]

    def measure(candidate: Candidate) -> str:
        commands = probe_commands(session, master, backend, sizes, env_files, script, timeout, None,
                                  extra_env={h.name: tunerplugin.for_host(candidate.settings, homes.get(h.name, "~"))
                                             for h in session.hosts},
                                  probe_args=args, unset=tuple(before))
        try:
            return run_probe(session, commands)[session.head.name]
        except SparkclusterError as e:  # a setting this cluster cannot run: no result, the others still count
            return f"probe failed: {e.message}"
    return measure


def _probe_script() -> str:
    """The probe's source, or the tests' double in its place (PROBE_DOUBLE_ENV)."""
    double = os.environ.get(PROBE_DOUBLE_ENV)
    if double:
        try:
            with open(double, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise SparkclusterError(f"{PROBE_DOUBLE_ENV}={double}: {e.strerror}",
                                    f"unset {PROBE_DOUBLE_ENV} (it is for sparkcluster's own tests)") from None
    return (resources.files("sparkcluster.nccl") / "probe.py").read_text()


def _write_envs(session: Session, texts: Mapping[str, str]) -> None:
    def write(host: Host) -> None:
        session.transport(host).write_file_atomic(remote_path(comm_env_path(host)), texts[host.name].encode(), 0o644)
    session.each(write)


def _record(session: Session, tuned: Mapping[str, Any] | None) -> None:
    """`comm_tuned` in every node's last-verify record (created where none is), or removed (None)."""
    target = shell_path(LAST_VERIFY_PATH)
    read = Command(f"cat {target} 2>/dev/null", timeout=30)

    def record(host: Host) -> None:
        try:
            doc = json.loads(session.run(host, read).stdout or "{}")
        except json.JSONDecodeError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        doc.pop("comm_tuned", None)
        if tuned is not None:
            doc["comm_tuned"] = dict(tuned)
        session.run(host, Command(f"mkdir -p {shell_path(LAST_VERIFY_PATH.rsplit('/', 1)[0])} && cat > {target}.tmp "
                                  f"&& mv {target}.tmp {target}", stdin=json.dumps(doc), timeout=30))
    session.each(record)


def render(result: TuneResult) -> str:
    """Each candidate's figures against the default's, the choice and where it went (or would go: --check)."""
    if result.choice is None:
        removed = ", ".join(f"{k}={v}" for k, v in result.before.items()) or "nothing (no tuned block)"
        verb = "removed" if result.written else "would remove (--check)"
        return f"verify --tune --reset: {verb} from every node's comm env: {removed}; NCCL's defaults apply"
    c = result.choice
    sizes = ", ".join(f"{size_words(b)} (concurrency {k})" for k, b in result.decode.items())
    of = f" of {result.model}" if result.model else ""
    lines = [f"verify --tune ({result.backend}, {result.transport}): all_reduce at the decode sizes{of} {sizes}, "
             f"summed; busbw at 64 MiB and above; each candidate's sum checked first",
             f"  {'CANDIDATE':<28}{'DECODE(us)':>11}{'VS DEFAULT':>12}{'BUSBW LOST':>12}  VERDICT"]
    for line in c.lines:
        decode = "-" if line.decode_us is None else f"{line.decode_us:.1f}"
        change = "-" if line.change is None or line.name == "default" else f"{line.change:+.0%}"
        lost = "-" if line.busbw_change is None or line.name == "default" else f"{line.busbw_change:.0%}"
        lines.append(f"  {line.name:<28}{decode:>11}{change:>12}{lost:>12}  {line.verdict}")
    lines += [f"  {name:<28}{'-':>11}{'-':>12}{'-':>12}  no result (the probe failed with it)"
              for name in result.unmeasured]
    if result.table:
        why = "; ".join(f"{node}: {reason}" for node, reason in result.table_refused.items())
        lines.append(f"per size, through NCCL's tuner plugin: {result.table}"
                     + (f"; not measured ({why})" if why else f"; measured as '{PER_SIZE_NAME}' above"))
    settings = " ".join(f"{k}={v}" for k, v in c.chosen.env)
    if not c.changes_anything:
        lines.append(f"kept the default: {c.reason}")
        if result.before:
            lines.append(("removed" if result.written else "would remove (--check)") + " the earlier tuning: "
                         + " ".join(f"{k}={v}" for k, v in result.before.items()))
    elif result.written:
        lines.append(f"chosen: {c.reason}\nset in every node's comm env: {settings} (the next serve's vLLM gets it; "
                     "`sparkcluster verify --tune --reset` goes back)")
    else:
        lines.append(f"chosen: {c.reason}\nwould set in every node's comm env (--check): {settings}")
    return "\n".join(lines)
