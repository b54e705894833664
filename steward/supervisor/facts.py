"""What the bring-up knows, published whole (`Facts`): the serving worker's model and the
times of the bring-ups.

One owner writes it, bringup.py, by putting a new record in place of the old; admission,
the job path, the loop and (through the supervisor's public reads) the front read it, and
no reader can change it or see half of an update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

GUESS = 10.0  # seconds a bring-up takes, until one is measured: Retry-After's guess


@dataclass(frozen=True)
class PromptBound:
    """What bounds a prompt before it is tokenised: the context, and the longest token's
    text (whitespace included: the longest tokens are runs of it)."""

    context_length: int
    max_token_chars: int

    def least_tokens(self, chars: int) -> int:
        """The fewest tokens a text of `chars` characters can be."""
        return -(-chars // self.max_token_chars)


@dataclass(frozen=True, kw_only=True)
class Model:
    """What the serving worker said of its model."""

    context_length: int | None = None
    max_token_chars: int | None = None  # the longest token's text: bounds a prompt
    max_batch: int | None = None
    thinking: bool = False
    dimensions: int = 0  # an embedding model's vectors (0: a generating model)
    model_bytes: int = 0  # the device memory the loaded model takes
    device_bytes: int = 0  # the device's, or its recommended working set where it has one
    gpu: bool = False  # where it runs

    @property
    def prompt_bound(self) -> PromptBound | None:
        """Known once a worker has loaded the model."""
        if self.context_length is None or self.max_token_chars is None:
            return None
        return PromptBound(self.context_length, self.max_token_chars)


@dataclass(frozen=True, kw_only=True)
class Facts:
    model: Model = Model()
    since: float  # the bring-up under way, or the recovery that may need one, began (monotonic)
    seconds: float = GUESS  # the last bring-up (a hot spare's swap included)
    # the last bring-up that loaded the model: what a replacement costs; `known` once
    # measured here or by an earlier load of the model
    loading_s: float = GUESS
    known: bool = False
    phases: Mapping[str, float] = field(default_factory=dict)  # the serving worker's bring-up
