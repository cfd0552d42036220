"""The record of the last verify every node keeps (LAST_VERIFY_PATH): `status` shows it as one line, doctor's
baselines read each link's busbw from it, and bench's decode budget its latency."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from ..engine.command import Command, shell_path
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.transport import Unreachable
from .latency import Latency
from .verifyresult import VerifyResult

LAST_VERIFY_PATH = "~/.config/sparkcluster/last-verify.json"  # on every node: what `status` shows


def record_doc(result: VerifyResult) -> dict[str, Any]:
    """What every node keeps of a verify (LAST_VERIFY_PATH): `status` shows it, doctor's baselines read each link's
    busbw, and bench's decode budget `latency_us` (message bytes -> all_reduce's median microseconds)."""
    largest = max((r.size_bytes for r in result.rows), default=0)
    best = max((r.best_busbw_gbps for r in result.rows if r.size_bytes == largest), default=None)
    return {"status": str(result.verdict.status), "cause": result.verdict.cause, "backend": result.backend,
            "busbw_gbps": best, "size_bytes": largest or None, "twins": result.twins,
            "links": {m.probe.label: m.busbw_gbps for m in result.links},  # each alone, for baselines
            **(result.latency or Latency(())).to_json(),
            "links_latency_us": {m.probe.label: m.latency.to_json()["latency_us"] for m in result.links if m.latency},
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def record_verdict(session: Session, result: VerifyResult) -> None:
    """Best effort: a node that cannot take the record keeps the verdict it had; the verdict is printed anyway.
    What verify --tune chose (`comm_tuned`) stays: the comm env still carries it, and this run measured with it."""
    doc = record_doc(result)
    target = shell_path(LAST_VERIFY_PATH)

    def record(host: Host) -> bool:
        try:
            kept = tuned_of(session.run(host, LAST_VERIFY_COMMAND).stdout)
            command = Command(f"mkdir -p {shell_path(LAST_VERIFY_PATH.rsplit('/', 1)[0])} && cat > {target}.tmp && "
                              f"mv {target}.tmp {target}", timeout=30,
                              stdin=json.dumps({**doc, **({"comm_tuned": kept} if kept is not None else {})}))
            return session.run(host, command).ok
        except Unreachable:  # it dropped off after the measurement: the verdict stands, its record waits
            return False

    session.each(record)


LAST_VERIFY_COMMAND = Command(f"cat {shell_path(LAST_VERIFY_PATH)} 2>/dev/null", timeout=30)


def tuned_of(text: str) -> dict[str, Any] | None:
    """The record's `comm_tuned` (what verify --tune chose), None where it holds none."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    tuned = doc.get("comm_tuned") if isinstance(doc, dict) else None
    return tuned if isinstance(tuned, dict) else None


def last_verify(text: str) -> str | None:
    """The record a node keeps as one line for `status`: "PASS, busbw 21.40 GB/s (gloo, 2026-11-24T05:01:02+00:00)";
    None when the node never verified (or the record is not ours)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
        return None
    busbw = doc.get("busbw_gbps")
    measured = f", busbw {busbw:.2f} GB/s" if isinstance(busbw, (int, float)) else ""
    cause = "" if doc["status"] == "PASS" else f": {doc.get('cause', '')}"
    settings = (tuned_of(text) or {}).get("settings")
    tuned = f", tuned {' '.join(f'{k}={v}' for k, v in settings.items())}" if isinstance(settings, dict) and \
        settings else ""
    return f"{doc['status']}{measured}{tuned} ({doc.get('backend', '?')}, {doc.get('at', '?')}){cause}"
