"""What a worker is started with: the one object that crosses `spawn` (pickled)."""

from __future__ import annotations

from dataclasses import dataclass

from steward.model.resolve import ModelSource
from steward.wire.faultspec import FaultSpec
from steward.wire.protocol import Calibration
from steward.wire.ranks import Hostfile


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    source: ModelSource
    generation: int
    specs: list[FaultSpec]  # what --inject-fault asks of this worker
    parent_pid: int
    memory_limit: int | None = None
    max_batch: int = 0  # 0: auto (width.py)
    prompt_cache_bytes: int = 0
    speculate: str = "none"  # config.SPECULATE: the engine's draft tokens (speculation.py)
    draft_model: str | None = None  # an MLX dir whose tokenizer is the model's (checked)
    warm: bool = False  # a warm spare: start the runtime, load the model only when told
    kind: str = "chat"  # or "embedding": what the worker loads and serves
    max_embedding_tokens: int = 300_000  # an embeddings request's inputs, in all
    prompt_cache_dir: str | None = None  # the prompt cache's disk tier (None: none)
    prompt_cache_disk_bytes: int = 0
    calibration: Calibration | None = None  # the model's first worker's: reused, not measured
    ranks: int = 1  # ranks of one mx.distributed group (ranks/group.py); 1: one process
    hostfile: Hostfile | None = None  # where each rank runs; None: all here
    distributed_backend: str = "ring"  # the group's MLX backend
    parallel: str = "auto"  # how the model is split over ranks (worker/sharding.py)
    rank_join_timeout: float = 60.0  # seconds every rank has to join its group
