"""The batch mask's own arithmetic, against llguidance's numpy reference: widened for a
model vocabulary padded past the tokenizer's, deduplicated, and unpacked on the device."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from llguidance.numpy import apply_token_bitmask_inplace

from steward.worker.grammar import Resident, _masked, _prepared


def reference(logits: np.ndarray, bits: np.ndarray, free: np.ndarray) -> np.ndarray:
    """What each row may sample: its bits over the tokenizer's ids; the ids past them only
    in rows without a grammar (`free`)."""
    out = logits.copy()
    covered = min(logits.shape[1], 32 * bits.shape[1])
    apply_token_bitmask_inplace(out[:, :covered], bits)
    out[~free, covered:] = -np.inf
    return out


@pytest.mark.parametrize(
    ("rows", "vocab", "tokenizer_vocab"),
    [(1, 4096, 4096), (8, 4096, 4096), (5, 4160, 4070), (6, 4000, 4070), (3, 100, 70)],
)
@pytest.mark.parametrize("batch_shape", [True, False])
def test_masks_match_the_reference(rows: int, vocab: int, tokenizer_vocab: int, batch_shape: bool):
    rng = np.random.default_rng(rows * vocab)
    words = (tokenizer_vocab + 31) // 32
    bits = rng.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int64).astype(np.int32)
    bits[rows // 2 :] = bits[0]  # rows under one schema in one state share a mask
    free = np.zeros(rows, np.bool_)
    free[1::3] = True
    bits[free] = -1
    if rows > 2:
        bits[2] = -1  # a grammar row allowing every token of the tokenizer: not a free row
        free[2] = False
    logits = rng.standard_normal((rows, vocab)).astype(np.float32)
    distinct, index, distinct_free = _prepared(bits, free)
    assert np.array_equal(distinct[index][:, :words], bits)  # each row's own mask
    shape = (rows, 1, vocab) if batch_shape else (rows, vocab)
    masked = _masked(mx.array(logits.reshape(shape)), distinct, index, distinct_free)
    got = np.array(masked).reshape(rows, vocab)
    want = reference(logits, bits, free)
    assert np.array_equal(np.isinf(got), np.isinf(want))
    assert np.array_equal(got[~np.isinf(got)], want[~np.isinf(want)])


def test_equal_rows_go_to_the_device_once() -> None:
    bits = np.full((32, 64), -1, np.int32)
    bits[::2, 3] = 7  # two distinct masks
    distinct, index, _ = _prepared(bits, np.zeros(32, np.bool_))
    assert len(distinct) == 2  # a power of two: one trace per count
    assert np.array_equal(distinct[index], bits)


def test_rows_with_one_sum_but_different_bits_stay_apart() -> None:
    bits = np.zeros((3, 4), np.int32)
    bits[0, 0] = bits[2, 0] = 1
    bits[1, 1] = 1  # sums like row 0, differs from it
    distinct, index, _ = _prepared(bits, np.zeros(3, np.bool_))
    assert np.array_equal(distinct[index], bits)


def test_a_mask_seen_again_is_not_uploaded_again() -> None:
    resident = Resident(entries=3, largest=1 << 10)
    mask = np.arange(8, dtype=np.uint32)
    first = resident.get(mask)
    assert resident.get(mask.copy()) is first  # the same bytes: already on the device
    other = mask.copy()
    other[0] = 9
    assert np.array_equal(np.array(resident.get(other)), other)
    assert resident.get(mask.reshape(2, 4)).shape == (2, 4)  # the same bytes, another shape
    assert resident.get(mask) is first
    resident.get(mask + 1)  # a fourth: the least recently used (`other`) leaves
    assert len(resident.arrays) == 3 and resident.get(mask) is first
    assert (other.tobytes(), other.shape, other.dtype.str) not in resident.arrays
    large = np.zeros(512, np.uint32)
    assert resident.get(large) is not resident.get(large)  # hashing would cost what it saves
