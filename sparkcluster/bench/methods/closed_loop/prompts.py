"""Prompts of a chosen token length without a tokenizer (bench must work offline, against any endpoint).

A prompt is a sequence of common English words drawn by a seeded generator. Each request gets its own seed,
so prompts differ from their first token on and a prefix cache (vLLM hashes blocks from the start) finds
nothing to reuse; with --prefix-cache every request sends the same prompt. The words-per-token ratio is
learnt from the server itself: short probes report `usage.prompt_tokens`, and a secant step on
(words, tokens) pairs lands on the target length in two or three probes for any tokenizer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

WORDS = """time person year way day thing man world life hand part child eye woman place work week case point
government company number group problem fact be have do say get make go know take see come think look want give
use find tell ask seem feel try leave call good new first last long great little own other old right big high
different small large next early young important few public bad same able to of in for on with at by from up
about into over after beneath under above the and that but or as if when than because while where so though
river stone garden window letter morning evening summer winter city road bridge music paper water light
table chair door field forest mountain island harbor market station engine signal cable switch rack server
memory network packet thread socket kernel driver module cluster tensor vector matrix layer model weight
token prompt answer question story chapter page line word sentence history science nature energy power
""".split()
SHARED_SEED = 0  # --prefix-cache: every request the same prompt
MAX_PROBES = 4


def prompt(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choices(WORDS, k=max(words, 1)))


def next_guess(target: int, samples: Sequence[tuple[int, int]]) -> int:
    """The word count to try next, from (words, prompt tokens) pairs measured so far (at least one): a secant
    through the last two distinct samples, or a proportional step from the only one."""
    words, tokens = samples[-1]
    earlier = [s for s in samples[:-1] if s[0] != words and s[1] != tokens]
    if earlier:
        w0, t0 = earlier[-1]
        slope = (tokens - t0) / (words - w0)
        if slope > 0:
            return max(1, round(words + (target - tokens) / slope))
    return max(1, round(words * target / max(tokens, 1)))


def close_enough(target: int, tokens: int) -> bool:
    return abs(tokens - target) <= max(1, target // 100)
