"""A Hugging Face model id as inventories and commands name it (ORG/NAME[@REVISION]): a value of the inventory's
language, checked before anything connects. Where its files live on a node is staging's business."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UsageError

COMMIT = re.compile(r"^[0-9a-f]{40}$")
# ORG/NAME, or a bare NAME for the Hub's oldest repos (gpt2, bert-base-uncased).
REPO = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class ModelRef:
    repo: str  # "Qwen/Qwen3-0.6B"
    revision: str = "main"  # a branch name or a 40-hex commit

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        repo, at, revision = text.partition("@")
        if not REPO.match(repo) or ".." in repo or "--" in repo:
            raise UsageError(f"{text!r} is not a Hugging Face model id", "write it as ORG/NAME[@REVISION], e.g. Qwen/Qwen3-0.6B")
        if at and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", revision):
            raise UsageError(f"invalid revision {revision!r} in {text!r}", "use a branch name or a commit hash")
        return cls(repo, revision or "main")

    @property
    def dir_name(self) -> str:
        return "models--" + self.repo.replace("/", "--")

    @property
    def is_commit(self) -> bool:
        return bool(COMMIT.match(self.revision))

    def __str__(self) -> str:
        return self.repo if self.revision == "main" else f"{self.repo}@{self.revision}"
