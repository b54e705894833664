"""Warm shapes: compile, at bring-up, the kernels a batch's first burst will need.

On a GPU, MLX builds kernels the first time it meets an operation's shapes, and a batch
meets new ones as members join in prefill groups and decode together. A worker that has
served only its canary (a hot spare, or any new worker) would pay that in its first burst,
which after a fault is every resumed stream at once: seconds of silence that every client
sees. So before it says `Ready`, a worker on a GPU runs a bounded batch like the one a
recovery replays: `width` short prompts of a few lengths, joining together and decoding a
few steps. It is counted in the load time (`bring_up_s`). On a CPU there is nothing to
compile, and the warm-up is skipped.
"""

from __future__ import annotations

import itertools

import mlx.core as mx

from steward.wire.protocol import Generate
from steward.worker.engine import Engine

PROMPT = "Warm the kernels for the shapes of a batch."
STEPS = 3  # tokens each member decodes
LENGTHS = 4  # distinct prompt lengths: prefill groups of unequal prompts pad differently

_ids = itertools.count(-(2**40), -1)  # never a client's id, nor the canary's


def run(engine: Engine, width: int) -> None:
    if mx.default_device().type != mx.DeviceType.gpu:
        return
    for i in range(width):
        prompt = PROMPT * (1 + i % LENGTHS)
        engine.add(
            Generate(
                id=next(_ids), seq=0, attempt=1, max_tokens=STEPS, prompt=prompt, ignore_eos=True
            )
        )
    while engine.busy:
        engine.step()
    engine.drop_all()  # nothing of the warm-up stays (its prompts in the prompt cache)
