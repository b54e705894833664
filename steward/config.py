"""`steward serve` settings: one frozen dataclass, filled by the command line (cli.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from steward.wire.ranks import Hostfile

SPECULATE = ("auto", "always", "none")  # `--speculate` (worker/speculation.py says each)


@dataclass(frozen=True)
class ServeConfig:
    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_restarts: int = 3
    restart_window: float = 600.0
    stall_timeout: float = 60.0
    load_timeout: float = 900.0
    on_fault: str = "recover"  # or "exit"
    drain_timeout: float = 30.0
    queue_size: int = 64
    queue_timeout: float = 30.0
    request_timeout: float = 600.0
    api_key: str | None = None
    api_key_file: str | None = None
    served_model_name: list[str] = field(default_factory=list)
    log_json: bool = False
    log_level: str = "info"
    worker_memory_limit: int | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    max_connections: int = 1024
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    max_edge: int = 1536
    max_image_pixels: int = 50_000_000
    max_image_bytes: int = 16 * 1024 * 1024
    max_images: int = 8
    allow_image_urls: bool = False
    max_batch: int = 0  # 0: auto, sized by memory and the measured knee (worker/width.py)
    max_n: int = 8  # choices per request
    strict_requests: bool = False  # refuse unknown fields and unservable tools (ignored.py)
    max_tokens_default: int = 4096  # the cap when a request gives no max_tokens (0: none)
    standby: str = "auto"  # auto, none, warm (runtime up, no model) or hot (model loaded)
    process_ahead: str = "auto"  # auto (on a GPU), on, off: supervisor/ahead.py
    prompt_cache_bytes: int = 1024 * 1024 * 1024
    speculate: str = "none"  # SPECULATE: members draft (worker/speculation.py); off until it pays
    draft_model: str | None = None  # a model with the same tokenizer, a source of drafts
    prompt_cache_dir: str | None = None  # the disk tier: none unless given
    prompt_cache_disk_bytes: int = 4 * 1024 * 1024 * 1024
    responses_store_bytes: int = 128 * 1024 * 1024  # stored Responses, oldest out first
    responses_store_age: float = 24 * 3600.0  # seconds a stored response is kept
    model_kind: str = "auto"  # chat or embedding; auto: read from the model's files (kind.py)
    max_embedding_inputs: int = 2048  # inputs of one embeddings request (OpenAI's bound)
    max_embedding_tokens: int = 300_000  # their tokens in all (OpenAI's bound)
    inject_fault: list[str] = field(default_factory=list)
    models: str | None = None  # a models file (SPEC §9): one TOML table per model
    memory_budget: int | None = None  # bytes resident models may take; None: the device's
    on_model_failed: str = "auto"  # exit, serve; auto: exit with one model, serve with more
    ranks: int = 1  # ranks of one mx.distributed group serving the model (ranks/)
    hostfile: str | None = None  # MLX's JSON hostfile: the ranks' hosts (ranks/hostfile.py)
    rank_hosts: Hostfile | None = None  # the hostfile, read (cli.py): no flag of its own
    distributed_backend: str = "any"  # the group's MLX backend: any or ring are built
    rank_join_timeout: float = 60.0  # seconds every rank of a group has to join it
    parallel: str = "auto"  # tensor, pipeline; auto: tensor where the model can (sharding.py)
