"""A Hugging Face model id as inventories and commands name it (ORG/NAME[@REVISION]): a value of the inventory's
language, checked before anything connects. Where its files live on a node is staging's business."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UsageError

COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A branch or tag as git's check-ref-format allows it, narrowed to what is safe as a path under refs/ on a node:
# `/`-separated parts of letters, digits, `.`, `_`, `-`; no part empty, `.`-led or `.lock`-ended; no `..`.
_REF_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
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
        if at and revision_problem(revision):
            raise UsageError(f"invalid revision {revision!r} in {text!r}: {revision_problem(revision)}",
                             "use a branch name (parts joined by /) or a commit hash")
        return cls(repo, revision or "main")

    def __post_init__(self) -> None:
        # A revision names paths on the nodes (refs/<revision>): one built without parse() is checked too.
        problem = revision_problem(self.revision)
        if problem:
            raise UsageError(f"invalid revision {self.revision!r} of {self.repo}: {problem}",
                             "use a branch name (parts joined by /) or a commit hash")

    @property
    def dir_name(self) -> str:
        return "models--" + self.repo.replace("/", "--")

    @property
    def is_commit(self) -> bool:
        return bool(COMMIT.match(self.revision))

    def __str__(self) -> str:
        return self.repo if self.revision == "main" else f"{self.repo}@{self.revision}"


def revision_problem(revision: str) -> str | None:
    """Why `revision` cannot name a branch safely (it becomes refs/<revision> on every node), or None."""
    if not revision:
        return "it is empty"
    if revision.startswith("/") or revision.endswith("/"):
        return "it starts or ends with /"
    for part in revision.split("/"):
        if part in ("", ".", ".."):
            return f"{part or 'an empty part'!r} is not a path part a ref may hold" if part else "it holds //"
        if ".." in part or part.endswith(".lock") or part.endswith(".") or not _REF_PART.fullmatch(part):
            return f"{part!r} is not a valid ref part (letters, digits, . _ -; no .., no leading . or trailing .lock)"
    return None
