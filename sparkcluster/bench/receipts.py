"""What either method's receipt reads (the endpoint's /version: the one reader of it, the closed loop's config
records it too) and where it is written (beside a file, or in a folder); each method assembles its own
(methods/*/receipt.py) from what the target and its run already hold."""

from __future__ import annotations

import json
from pathlib import Path

from ..engine.localfiles import write_text
from ..observe.bounded import request
from ..observe.scrape import SCRAPE_TIMEOUT_S
from .receipt import Receipt


def endpoint_version(base_url: str, api_key: str | None = None) -> str | None:
    """What the endpoint's /version says (vLLM's release), None where it says nothing readable; the key, where
    bench has one, sent as to the endpoint's other paths (vLLM leaves /version open; another server may not)."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/version"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    answer = request(url, timeout_s=SCRAPE_TIMEOUT_S, limit_bytes=4096, headers=headers)  # the whole GET, bounded
    try:
        doc = json.loads(answer.body) if answer.status == 200 else None
    except ValueError:
        return None
    version = doc.get("version") if isinstance(doc, dict) else None
    return version if isinstance(version, str) else None


def receipt_path(output: Path) -> Path:
    """Where the receipt of a file whose format has no room for it goes: beside it (bench.csv.receipt.json)."""
    return output.with_name(output.name + ".receipt.json")


def save(path: Path, receipt: Receipt) -> Path:
    """Through engine/localfiles.py: a link planted at FILE.csv.receipt.json is replaced, never written through."""
    return write_text(path, json.dumps(receipt.to_json(), indent=2) + "\n")


def write_beside(output: Path, receipt: Receipt) -> Path:
    return save(receipt_path(output), receipt)
