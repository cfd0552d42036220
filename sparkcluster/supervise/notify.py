"""`--notify URL`: each incident POSTed as JSON, with a `text` field, so a chat webhook (Slack's, Mattermost's, a
Discord-compatible one) shows it as a message and a script reads the rest. A receiver that does not answer costs the
supervisor at most NOTIFY_TIMEOUT_S and never stops it from acting."""

from __future__ import annotations

import json
import logging

from ..observe.bounded import request
from ..serving.incidents import Incident

NOTIFY_TIMEOUT_S = 5.0
log = logging.getLogger("sparkcluster.supervise")


def body(incident: Incident) -> dict[str, object]:
    return {**incident.to_json(), "text": f"sparkcluster: {incident.line()}"}


def post(url: str, incident: Incident) -> bool:
    """True when the receiver answered 2xx."""
    answer = request(url, timeout_s=NOTIFY_TIMEOUT_S, limit_bytes=64 * 1024, data=json.dumps(body(incident)).encode(),
                     headers={"Content-Type": "application/json"})
    if not 200 <= answer.status < 300:
        log.warning("the incident could not be posted to the --notify URL (HTTP %s)", answer.status or "no answer")
        return False
    return True
