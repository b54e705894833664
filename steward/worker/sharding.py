"""How a model is split over the ranks of a group: `--parallel tensor|pipeline`.

Tensor parallel (mlx-lm's `shard()`): every rank holds 1/N of every attention and MLP
layer, and each layer sums its ranks' parts (`all_sum`); the heads must divide over N.
Pipeline parallel (mlx-lm's `pipeline()`, on the models that have it: qwen2/3, deepseek
v2/v3, glm4-moe and others, not llama in 0.32): every rank holds a run of whole layers and
hands its activations to the next (`send`/`recv`), so a model too big for one host's memory
fits across several however its heads fall. `auto` is tensor where the model can, else
pipeline. Whatever cannot be split as asked is a ValueError: a configuration error, exit 78,
said by rank 0.
"""

from __future__ import annotations

from typing import Any

AUTO, TENSOR, PIPELINE = "auto", "tensor", "pipeline"


def ways(model: Any) -> list[str]:
    """The ways mlx-lm can split this model, tensor first."""
    found = [TENSOR] if hasattr(model, "shard") else []
    if hasattr(getattr(model, "model", None), "pipeline"):
        found.append(PIPELINE)
    return found


def split(model: Any, group: Any, parallel: str) -> str:
    """Keep this rank's part of `model` in the `group` (an mx.distributed.Group), as
    `parallel` asks; the way it was split."""
    name = type(model).__module__.rsplit(".", 1)[-1]
    can = ways(model)
    if not can:
        raise ValueError(f"a {name} model cannot be split over ranks (no shard() or pipeline())")
    way = can[0] if parallel == AUTO else parallel
    if way not in can:
        raise ValueError(f"--parallel {way}: a {name} model has no {_method(way)}")
    size = group.size()
    if way == TENSOR:
        heads = [
            getattr(layer.self_attn, name, 0)
            for layer in getattr(model, "layers", [])
            for name in ("n_heads", "n_kv_heads")
        ]
        if any(count % size for count in heads):
            raise ValueError(f"the model's attention heads do not divide over {size} ranks")
        model.shard(group)
    else:
        if len(model.model.layers) < size:
            raise ValueError(
                f"the model's {len(model.model.layers)} layers are fewer than {size} ranks"
            )
        model.model.pipeline(group)
    return way


def _method(way: str) -> str:
    return "shard() (tensor parallel)" if way == TENSOR else "pipeline() in mlx-lm"
