"""The served model's tokenizer.json from the head's HF cache (where serve staged the model), for prompts cut in
the model's own tokens when this machine has no snapshot of it. Kept under ~/.cache/sparkcluster/tokenizers,
so the next run reads it locally. One SSH read, bounded in size; None when the head has none."""

from __future__ import annotations

import json
from pathlib import Path

from ....engine.command import Command
from ....engine.remote import HF_HOME
from ....engine.session import Session
from .corpus import MAX_TOKENIZER_BYTES, hf_hub_cache, snapshot_tokenizer


def local_copy(model: str) -> Path:
    return Path.home() / ".cache" / "sparkcluster" / "tokenizers" / model.replace("/", "--") / "tokenizer.json"


def script(model: str) -> str:
    """A shell line printing the snapshot's tokenizer.json (refs/main's snapshot, else any) and nothing else."""
    repo = f'"{HF_HOME}/hub/models--{model.replace("/", "--")}"'
    return (f'repo={repo}; ref=$(cat "$repo/refs/main" 2>/dev/null); f="$repo/snapshots/$ref/tokenizer.json"; '
            f'[ -n "$ref" ] && [ -f "$f" ] || f=$(ls "$repo"/snapshots/*/tokenizer.json 2>/dev/null | head -n 1); '
            f'[ -n "$f" ] && head -c {MAX_TOKENIZER_BYTES} "$f"')


def for_target(session: Session, config: dict[str, object], given: str | None) -> Path | None:
    """The served model's (`config`'s hf_model, as the serve record names it), unless --tokenizer `given` one."""
    hf_model = config.get("hf_model")
    return fetch(session, hf_model) if not given and isinstance(hf_model, str) else None


def fetch(session: Session, model: str) -> Path | None:
    """The model's tokenizer.json: this machine's HF cache, an earlier copy, else read from the head."""
    if "/" not in model or any(c in model for c in "\"'`$\\ ") or ".." in model:
        return None  # not an HF repo id (a local path or a served name): nothing to look up
    if snapshot_tokenizer(model, hf_hub_cache()) is not None:
        return None  # find_tokenizer reads the local one
    copy = local_copy(model)
    if copy.is_file():
        return copy
    result = session.run(session.head, Command(script(model), timeout=120))
    if not result.ok or not result.stdout.strip():
        return None
    try:
        json.loads(result.stdout)
    except ValueError:
        return None  # cut short or not JSON: the word fallback is better than a broken tokenizer
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(result.stdout, encoding="utf-8")
    return copy
