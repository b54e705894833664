"""The canary: a fixed short greedy generation whose token ids must not change.

The first worker's answer is the golden one; after a fault, a canary that raises, hangs,
or answers differently means the backend is poisoned and the worker is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

PROMPT = "The capital of France is"
MAX_TOKENS = 8


@dataclass(frozen=True)
class CanaryResult:
    tokens: tuple[int, ...]
    decode_tps: float


def params() -> dict[str, object]:
    return {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0}
