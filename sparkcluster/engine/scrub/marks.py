"""What every pass of the scrubber shares: the mark a secret leaves, and the tally of what was scrubbed by kind."""

from __future__ import annotations

from collections import Counter

SCRUBBED = "[scrubbed]"
Tally = Counter[str]  # kind ("private key", "the value of HF_TOKEN") -> how many were scrubbed
