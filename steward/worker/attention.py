"""A few queries' attention as plain matrix products, where MLX runs on CUDA.

MLX's CUDA backend runs `mx.fast.scaled_dot_product_attention` with one query on a kernel
of its own, and with more through cuDNN, which builds an execution graph for each new
shape. A verify step (speculation.py) feeds each row a few positions against a cache that
is longer at every step, so every verify step was a new shape: on the H200 a verify step
of the SmolLM2-135M shape took about 50 ms against a 5 ms decode step, whatever its width
(`python -m bench.verify_step`). Attention over a few queries is small work: two matrix
products and a softmax, as mlx-lm computes it for a quantized cache, with no graph to
build. Prefill chunks (hundreds of queries) keep the fused path.

`route()` is called once where the worker's model is loaded; on Metal and the CPU it
changes nothing.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

FEW = 32  # queries a head at most, for plain products (a verify step feeds 1 + its drafts)


def route() -> None:
    """`mx.fast.scaled_dot_product_attention` computes few queries with plain products
    from now on, in this process, where the device is CUDA's."""
    fused = mx.fast.scaled_dot_product_attention
    if not mx.cuda.is_available() or getattr(fused, "routed", False):
        return

    def attention(
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        *,
        scale: float,
        mask: Any = None,
        sinks: mx.array | None = None,
        **rest: Any,
    ) -> mx.array:
        if 1 < queries.shape[2] <= FEW and sinks is None:
            return products(queries, keys, values, scale, mask)
        return fused(queries, keys, values, scale=scale, mask=mask, sinks=sinks, **rest)

    attention.routed = True  # type: ignore[attr-defined]
    mx.fast.scaled_dot_product_attention = attention


def products(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any
) -> mx.array:
    """softmax(q kᵀ · scale, masked) v, heads grouped as the keys' (mlx-lm's order of
    operations for a quantized cache, with plain products)."""
    batch, heads, length, dim = queries.shape
    groups = keys.shape[1]
    queries = (queries * scale).reshape(batch, groups, heads // groups, length, dim)
    scores = queries @ mx.expand_dims(keys, 2).swapaxes(-1, -2)
    if isinstance(mask, str):  # "causal": the queries are the keys' last
        total = scores.shape[-1]
        mask = mx.arange(total - length, total)[:, None] >= mx.arange(total)[None]
    if mask is not None:
        mask = mx.expand_dims(mask, 2) if mask.ndim > 3 else mask
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    weights = mx.softmax(scores, axis=-1, precise=True)
    return (weights @ mx.expand_dims(values, 2)).reshape(batch, heads, length, dim)
