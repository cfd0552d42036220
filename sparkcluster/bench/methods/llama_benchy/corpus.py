"""The text and the tokenizer llama-benchy's prompts are cut from: token slices of a book at a random offset,
decoded with the model's own tokenizer, so a prompt of N tokens is N tokens to the server too.

The book is llama-benchy's (Project Gutenberg 1661), read from llama-benchy's own cache when it is there
(`~/.cache/llama-benchy/<md5 of the URL>.txt`, so a machine that ran llama-benchy once needs no network), else
downloaded once into that cache; `--corpus FILE` gives any text instead. The tokenizer is a tokenizer.json
(`--tokenizer`, a file or a snapshot directory), else the model's snapshot in the HF cache; without either (or
without the `tokenizers` package) prompts are counted in words, and the run learns tokens per word from the
server's own usage at warm-up, so the server still receives about the requested token counts.
"""

from __future__ import annotations

import hashlib
import os
import random
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ....engine.errors import SparkclusterError, UsageError

BOOK_URL = "https://www.gutenberg.org/files/1661/1661-0.txt"  # llama-benchy 0.4.0's --book-url default
BOOK_START = "*** START OF THE PROJECT GUTENBERG EBOOK"
MAX_CORPUS_BYTES = 64 << 20  # a book is a few hundred KiB; a corpus larger than this is a mistake
MAX_TOKENIZER_BYTES = 64 << 20


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass
class HFTokenizer:
    """A tokenizer.json through the `tokenizers` package, as llama-benchy's lightweight tokenizer uses it."""
    name: str
    inner: Any

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.inner.decode(ids, skip_special_tokens=False))


@dataclass
class WordTokenizer:
    """The offline fallback: one token per whitespace-separated word. `tokens_per_word` is learnt from the
    server at warm-up (see Corpus.calibrate), so prompts still come out at about the requested token counts."""
    name: str = "words (no tokenizer found: calibrated on the server's usage)"
    tokens_per_word: float = 1.0

    def __post_init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for word in text.split():
            index = self.vocab.get(word)
            if index is None:
                index = self.vocab[word] = len(self.words)
                self.words.append(word)
            out.append(index)
        return out

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.words[i] for i in ids)


def hf_hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"


def snapshot_tokenizer(model: str, hub: Path) -> Path | None:
    """tokenizer.json of `model`'s snapshot in an HF cache: the one refs/main names, else any snapshot."""
    repo = hub / f"models--{model.replace('/', '--')}"
    ref = repo / "refs" / "main"
    candidates = []
    if ref.is_file():
        candidates.append(repo / "snapshots" / ref.read_text().strip() / "tokenizer.json")
    candidates += sorted((repo / "snapshots").glob("*/tokenizer.json"))
    return next((c for c in candidates if c.is_file()), None)


def load_tokenizer_file(path: Path) -> Tokenizer | None:
    """A tokenizer.json as a tokenizer; None when the `tokenizers` package is not installed."""
    try:
        from tokenizers import Tokenizer as RustTokenizer
    except ImportError:
        return None
    if path.stat().st_size > MAX_TOKENIZER_BYTES:
        raise UsageError(f"{path} is larger than {MAX_TOKENIZER_BYTES >> 20} MiB: not a tokenizer.json",
                         "give the model's tokenizer.json (or its snapshot directory) with --tokenizer")
    try:
        return HFTokenizer(str(path), RustTokenizer.from_file(str(path)))
    except Exception as e:  # the Rust side raises its own Exception type for every malformed file
        raise UsageError(f"{path}: not a tokenizer.json ({str(e)[:200]})",
                         "give the model's tokenizer.json (or its snapshot directory) with --tokenizer") from None


def find_tokenizer(flag: str | None, model: str | None) -> Tokenizer:
    """--tokenizer (a file or a directory holding tokenizer.json), else the model's snapshot in the local HF
    cache, else the word fallback."""
    if flag:
        path = Path(flag)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise UsageError(f"--tokenizer {flag}: no tokenizer.json there",
                             "give a tokenizer.json, or the model's snapshot directory that holds one")
        found = load_tokenizer_file(path)
        if found is None:
            raise UsageError("--tokenizer needs the `tokenizers` package", "pip install tokenizers")
        return found
    if model:
        path_in_cache = snapshot_tokenizer(model, hf_hub_cache())
        if path_in_cache is not None:
            found = load_tokenizer_file(path_in_cache)
            if found is not None:
                return found
    return WordTokenizer()


def book_cache(url: str) -> Path:
    """Where llama-benchy keeps a downloaded book (shared with it on purpose)."""
    return Path.home() / ".cache" / "llama-benchy" / f"{hashlib.md5(url.encode()).hexdigest()}.txt"


def read_corpus(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_CORPUS_BYTES:
            raise UsageError(f"--corpus {path} is larger than {MAX_CORPUS_BYTES >> 20} MiB",
                             "give a book-sized text file (a few MiB at most)")
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"--corpus {path}: {e.strerror}", "give a readable text file") from None
    if len(text.split()) < 1000:
        raise UsageError(f"--corpus {path} holds fewer than 1,000 words",
                         "give a longer text (a book): prompts are slices of it at random offsets")
    return text


def book_text(url: str, timeout: float = 30.0) -> str:
    """The book from llama-benchy's cache, or downloaded into it (cut at the Gutenberg start marker, as
    llama-benchy does)."""
    cache = book_cache(url)
    if cache.is_file():
        return cache.read_text(encoding="utf-8", errors="replace")
    text: str
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read(MAX_CORPUS_BYTES).decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise SparkclusterError(f"the book llama-benchy cuts its prompts from is not reachable: {url}: {e}",
                                "give a text file with --corpus FILE (any book), or put the book in "
                                f"{cache}") from None
    start = text.find(BOOK_START)
    text = text[start:] if start != -1 else text
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(text, encoding="utf-8")
    return text


class Corpus:
    """Prompts as llama-benchy cuts them: the corpus tokenized once, then for each request a random offset and
    a slice of depth + pp tokens, the first `depth` decoded as the context and the rest as the prompt."""

    def __init__(self, text: str, tokenizer: Tokenizer, seed: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokenizer.encode(text)
        if len(self.tokens) < 2:
            raise UsageError("the corpus holds no text to cut prompts from", "give a book with --corpus FILE")
        self.rng = random.Random(seed)

    def _count(self, tokens: int) -> int:
        """Corpus tokens that make `tokens` server tokens (words for the fallback: scaled by its ratio)."""
        if isinstance(self.tokenizer, WordTokenizer):
            return max(1, round(tokens / self.tokenizer.tokens_per_word)) if tokens > 0 else 0
        return tokens

    def generate(self, prompt_tokens: int, context_tokens: int = 0, no_cache: bool = False) -> tuple[str, str]:
        suffix = f" {self.rng.getrandbits(128):032x}" if no_cache else ""
        suffix_len = len(self.tokenizer.encode(suffix)) if suffix else 0
        context, prompt = self._count(context_tokens), self._count(max(0, prompt_tokens - suffix_len))
        needed = context + prompt
        pool = self.tokens
        if len(pool) < needed + 1:
            pool = pool * (needed // len(pool) + 2)
        start = self.rng.randrange(0, len(pool) - needed)
        chosen = pool[start:start + needed]
        context_text = self.tokenizer.decode(chosen[:context]) if context > 0 else ""
        return context_text, self.tokenizer.decode(chosen[context:]) + suffix

    def batch(self, size: int, prompt_tokens: int, context_tokens: int, no_cache: bool) -> list[tuple[str, str]]:
        return [self.generate(prompt_tokens, context_tokens, no_cache) for _ in range(size)]

    def sample(self, tokens: int) -> str:
        """A stretch of the corpus, for learning the server's tokens per corpus token."""
        return self.tokenizer.decode(self.tokens[:min(tokens, len(self.tokens))])
