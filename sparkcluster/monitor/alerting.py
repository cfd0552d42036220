"""`monitor up --notify URL`: the distribution's Alertmanager beside Prometheus, sending every alert (and its
resolution) to one webhook, as the supervisor's --notify does for its incidents. The URL may carry a token (Slack's
and most chat services' webhooks do): it lives in alertmanager.yml only (mode 0600, in a private folder), never in
a command line, an outcome or --json."""

from __future__ import annotations

import argparse
import re

import yaml

WEBHOOK = re.compile(r"https?://[^\s/?#]+(?:[/?#]\S*)?")


def notify_url(text: str) -> str:
    if not WEBHOOK.fullmatch(text):
        raise argparse.ArgumentTypeError("--notify takes an http:// or https:// webhook URL (Alertmanager posts each "
                                         "alert there as JSON)")
    return text


def alertmanager_config(url: str) -> str:
    """One route to one webhook: alerts grouped per alert and node, the first sent 10 s after it fires (so that a
    node's alerts arrive together), repeated every 4 h while it lasts, and its resolution sent too."""
    doc = {"route": {"receiver": "notify", "group_by": ["alertname", "node"], "group_wait": "10s",
                     "group_interval": "1m", "repeat_interval": "4h"},
           "receivers": [{"name": "notify", "webhook_configs": [{"url": url, "send_resolved": True}]}]}
    return "# Written by `sparkcluster monitor up --notify`; rewritten by it.\n" + yaml.safe_dump(doc, sort_keys=False)
