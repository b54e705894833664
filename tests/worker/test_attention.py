"""A few queries' attention as plain products (attention.py) answers as MLX's fused
attention does: causal, under a batch's left padding, with grouped heads."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.base import create_causal_mask

from steward.worker.attention import products


@pytest.mark.parametrize("heads,groups", [(4, 4), (9, 3)])
@pytest.mark.parametrize("masking", ["causal", "padded", "none"])
def test_products_match_the_fused_attention(heads: int, groups: int, masking: str) -> None:
    mx.random.seed(heads * 7 + len(masking))
    batch, length, total, dim = 3, 5, 40, 64
    queries = mx.random.normal((batch, heads, length, dim))
    keys, values = (mx.random.normal((batch, groups, total, dim)) for _ in range(2))
    mask = {
        "causal": "causal",
        "padded": create_causal_mask(length, total - length, left_padding=mx.array([0, 3, 17])),
        "none": None,
    }[masking]
    scale = dim**-0.5
    fused = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
    ours = products(queries, keys, values, scale, mask)
    assert ours.shape == fused.shape
    assert mx.allclose(ours, fused, atol=1e-5).item()
