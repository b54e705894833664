"""The lean decode step gives mlx-lm's tokens; prefill chunks and `--max-batch auto` are
sized by what was measured.

Real MLX on the tiny model for the step; the sizing rules are pure arithmetic over what the
batch counts and what the warm-up times."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from steward.wire.protocol import Generate
from steward.worker import chunks, width
from steward.worker.chunks import Chunks


def load(model: Path):
    from steward.worker.backend import Backend
    from steward.worker.injection import Injector

    return Backend(model, Injector([], 1))


@pytest.fixture(scope="module")
def backend(tiny_model: Path):
    return load(tiny_model)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path):
    """The tiny model in bfloat16, as real models run: near-equal logits round into ties."""
    from tests.tinymodel import build_tiny_model

    out = tmp_path_factory.mktemp("bf16") / "tiny"
    return load(build_tiny_model(out, default_model_dir, dtype="bfloat16"))


def answers(backend, reqs: list[Generate], lean: bool) -> dict[int, tuple[list[int], list]]:
    """Each request's tokens and log-probabilities, decoded in one batch."""
    from steward.worker.engine import Engine

    engine = Engine(backend, 8, 0)
    if not lean:
        engine.batch.stock()
    seen: dict[int, tuple[list[int], list]] = {req.id: ([], []) for req in reqs}
    for req in reqs:
        engine.add(req)
    while engine.busy:
        for token in engine.step().tokens:
            if token.token >= 0:
                seen[token.id][0].append(token.token)
                seen[token.id][1].append(token.logprob)
    return seen


def asks(**extra: object) -> list[Generate]:
    prompts = ["Once upon a time", "The weather today", "In the beginning", "Numbers: 1, 2"]
    return [
        Generate(id=i + 1, seq=i + 1, attempt=1, max_tokens=12, prompt=p, **extra)
        for i, p in enumerate(prompts)
    ]


@pytest.mark.parametrize(
    "sampling",
    [{}, {"temperature": 0.8}, {"temperature": 0.8, "top_p": 0.5, "seed": 3}],
    ids=["greedy", "shared-sampler", "seeded"],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_lean_step_gives_mlx_lms_tokens(request, sampling: dict, dtype: str) -> None:
    import mlx.core as mx

    backend = request.getfixturevalue("backend" if dtype == "float32" else "bf16")
    mx.random.seed(11)
    lean = answers(backend, asks(**sampling), lean=True)
    mx.random.seed(11)
    stock = answers(backend, asks(**sampling), lean=False)
    assert {i: t for i, (t, _) in lean.items()} == {i: t for i, (t, _) in stock.items()}
    assert all(len(tokens) == 12 for tokens, _ in lean.values())


def test_the_lean_draw_is_mlx_lms_greedy_token_in_bfloat16() -> None:
    """Near-equal logits round into ties once normalized in bf16: an argmax of the raw
    logits picks another token for about one row in ten (random rows, sigma 0.5)."""
    import mlx.core as mx
    from mlx_lm.sample_utils import greedy_sampler

    from steward.worker.batch import sample

    mx.random.seed(5)
    logits = (0.5 * mx.random.normal((2048, 512))).astype(mx.bfloat16)
    stock = greedy_sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    assert mx.array_equal(sample(greedy_sampler, logits), stock).item()
    assert not mx.array_equal(mx.argmax(logits, axis=-1), stock).item()  # the trap is real


def test_a_member_asking_for_logprobs_gets_them_beside_lean_ones(backend) -> None:
    reqs = asks()
    reqs[2] = msgspec.structs.replace(reqs[2], logprobs=2)
    seen = answers(backend, reqs, lean=True)
    stock = answers(backend, reqs, lean=False)
    tokens, logprobs = seen[3]
    assert tokens == stock[3][0]
    assert all(lp is not None for lp in logprobs) and len(logprobs) == 12
    assert [lp.logprob for lp in logprobs] == pytest.approx([lp.logprob for lp in stock[3][1]])
    assert all(lp is None for lp in seen[1][1])  # nobody asked for these


class Prefill:
    """What the chunks read of the batch (batch.py): the prompt tokens it prefilled and
    their seconds, the prompts waiting, and the chunk it was given."""

    def __init__(self, prompts: int) -> None:
        self.tokens, self.seconds, self.waiting, self.size = 0, 0.0, prompts, 0

    def prefill_counters(self) -> tuple[int, float]:
        return self.tokens, self.seconds

    def prompts_waiting(self) -> int:
        return self.waiting

    def chunk(self, size: int) -> None:
        self.size = size


def test_chunks_take_what_the_prompts_prefill_in_the_budget() -> None:
    sized = Chunks()
    batch = Prefill(prompts=3)
    sized.resize(batch)
    assert batch.size == chunks.LOW  # nothing measured yet
    batch.tokens, batch.seconds = 3 * 512, 0.0128  # 120k tok/s
    sized.measured(batch)
    sized.resize(batch)
    # 120k tok/s x 0.1 s over three prompts: 4,000 tokens each, to a power of two
    assert sized.size == batch.size == 2048
    batch.waiting = 1
    sized.resize(batch)
    assert sized.size == chunks.HIGH  # one prompt alone takes the largest chunk
    batch.tokens += 100  # a prompt's short tail is not timed
    batch.seconds += 1.0
    sized.measured(batch)
    assert sized.rate == pytest.approx(120_000)


def test_auto_width_is_the_knee_within_memory(backend) -> None:
    assert width.knee({8: 1000, 16: 2000, 32: 3900, 64: 4000, 128: 4100}) == 32
    assert width.knee({8: 1000, 16: 900}) == 8
    assert width.widths(100) == [8, 16, 32, 64]
    assert width.widths(3) == [3]
    per_token = width.kv_bytes_per_token(backend.model)  # measured: float32 keys and values
    args = backend.model.args
    assert per_token == 2 * args.num_hidden_layers * args.num_key_value_heads * 4 * (
        args.hidden_size // args.num_attention_heads
    )
    assert width.fits(per_token, 2048, free=per_token * 2048 * 5) == 5
    assert width.fits(per_token, 2048, free=0) == 1
    assert width.free_bytes(100, 50, 30) == 10
