"""The `steward` command: serve, import, drill, --version.

Every `serve` flag also reads `STEWARD_<FLAG>` from the environment (SPEC §5); the
command line wins. A model or setting that cannot work exits 78 before anything starts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steward import __version__, drill
from steward.config import SPECULATE, ServeConfig
from steward.front.dialects.openai import MAX_N

if TYPE_CHECKING:
    from steward.pool.catalog import ModelEntry

EX_CONFIG = 78
DEFAULTS = ServeConfig()


def byte_size(text: str) -> int:
    """`2G`, `512M`, `65536`: bytes (powers of 1024)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def batch_width(text: str) -> int:
    """`auto` (0) or a width of at least 1."""
    if text.strip().lower() == "auto":
        return 0
    width = int(text)
    if width < 1:
        raise argparse.ArgumentTypeError(f"{text}: auto or at least 1")
    return width


def _env(flag: str) -> str | None:
    return os.environ.get("STEWARD_" + flag.upper().replace("-", "_"))


def _flag(
    parser: argparse.ArgumentParser, flag: str, kind: Callable[[str], Any], help: str, **kwargs: Any
) -> None:
    name = flag.replace("-", "_")
    default = getattr(DEFAULTS, name)
    env = _env(flag)
    if kind is bool:
        on = env is not None and env.lower() in ("1", "true", "yes", "on")
        parser.add_argument("--" + flag, action="store_true", default=on or default, help=help)
    elif isinstance(default, list):
        sep = ";" if flag == "inject-fault" else ","
        seed = [v for v in env.split(sep) if v.strip()] if env else []
        parser.add_argument(
            "--" + flag, action="append", type=kind, default=seed, help=help, **kwargs
        )
    else:
        parser.add_argument(
            "--" + flag,
            type=kind,
            default=kind(env) if env else default,
            help=f"{help} (default: {kwargs.pop('shown', default)})",
            **kwargs,
        )


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over the OpenAI API")
    p.add_argument(
        "--model",
        action="append",
        default=None,
        help="MLX model dir, .gguf file, or a repo id in the local HF cache; NAME=PATH, "
        "repeated, serves several models (the first is the default); "
        "default: the embedded SmolLM2-135M-Instruct",
    )
    _flag(p, "models", str, "a TOML file of the models to serve, one [NAME] table each")
    _flag(
        p,
        "memory-budget",
        byte_size,
        "memory resident models may take; beyond, idle ones are unloaded (default: the "
        "device's memory, 90%%)",
    )
    _flag(
        p,
        "on-model-failed",
        str,
        "when one model's restart budget is spent: exit 75, or serve the other models "
        "(auto: exit with one model, serve with several)",
        choices=["auto", "exit", "serve"],
    )
    _flag(p, "host", str, "address to bind")
    _flag(p, "port", int, "port to bind")
    _flag(p, "max-restarts", int, "worker restarts allowed in --restart-window before exit 75")
    _flag(p, "restart-window", float, "seconds over which restarts are counted")
    _flag(p, "stall-timeout", float, "the most silence ever tolerated from a worker (seconds)")
    _flag(p, "load-timeout", float, "seconds a worker may take to load the model")
    _flag(
        p,
        "on-fault",
        str,
        "recover: replace a poisoned worker; exit: exit 75 instead",
        choices=["recover", "exit"],
    )
    _flag(p, "drain-timeout", float, "seconds in-flight requests get after SIGTERM/SIGINT")
    _flag(p, "queue-size", int, "requests that may wait for the worker")
    _flag(p, "queue-timeout", float, "seconds a request may wait in the queue")
    _flag(p, "request-timeout", float, "seconds a request may take in all")
    _flag(
        p,
        "api-key",
        str,
        "require 'Authorization: Bearer KEY' on /v1/* (prefer STEWARD_API_KEY or "
        "--api-key-file: a flag's value shows in `ps`)",
    )
    _flag(p, "api-key-file", str, "read the API key from the first line of this file")
    _flag(
        p,
        "served-model-name",
        str,
        "another name clients may use for the model; a glob (claude-*) maps every name it "
        "matches to the model, unlisted in /v1/models",
    )
    _flag(p, "log-json", bool, "log one JSON object per line")
    _flag(p, "log-level", str, "log level")
    _flag(p, "worker-memory-limit", byte_size, "address-space limit of the worker (e.g. 8G)")
    _flag(p, "max-body-bytes", byte_size, "largest request body accepted")
    _flag(
        p,
        "max-connections",
        int,
        "open connections served; beyond, 503 except health and metrics (lowered to fit "
        "the file-descriptor limit)",
    )
    _flag(p, "header-timeout", float, "seconds a client has to send a request's headers")
    _flag(p, "body-timeout", float, "seconds a client has to send a request's body (else 408)")
    _flag(p, "keep-alive-timeout", float, "seconds an idle keep-alive connection is kept")
    _flag(p, "max-edge", int, "longest image edge; larger images are downscaled")
    _flag(p, "max-image-pixels", int, "largest image accepted, in pixels (read from its header)")
    _flag(p, "max-image-bytes", byte_size, "largest encoded image accepted")
    _flag(p, "max-images", int, "most images in one request")
    _flag(p, "allow-image-urls", bool, "allow remote image URLs")
    _flag(
        p,
        "max-batch",
        batch_width,
        "requests decoded together: auto (from memory and the measured knee) or a number",
        metavar="auto|N",
        shown="auto",
    )
    _flag(p, "max-n", int, "most choices (`n`) one request may ask for, each a batch member")
    _flag(
        p,
        "strict-requests",
        bool,
        "refuse a field steward does not know, or a tool it cannot serve, with a 400 naming "
        "it (default: ignore it, naming it in the steward-ignored response header)",
    )
    _flag(
        p,
        "max-tokens-default",
        int,
        "tokens an answer may have when the request sets no max_tokens, or less where the "
        "context leaves less room (0: the rest of the context)",
    )
    _flag(
        p,
        "standby",
        str,
        "a spare worker for fast recovery: auto (hot where a second copy of the model fits "
        "the device with headroom, else warm), warm (runtime started, no model), hot (model "
        "loaded, canary passed; twice the model's memory), none",
        choices=["auto", "none", "warm", "hot"],
    )
    _flag(
        p,
        "process-ahead",
        str,
        "keep the next worker's process started, its runtime imported (host memory only, no "
        "model, no device): a replacement or spare starts at the device. auto: where the "
        "workers run on a GPU",
        choices=["auto", "on", "off"],
    )
    _flag(
        p,
        "speculate",
        str,
        "speculative decoding: auto (each member drafts tokens from its request's prediction "
        "and by lookup in its own prompt and answer, while they are accepted, where verify "
        "steps measure faster a token than decode steps), always (wherever they are "
        "accepted, paying or not), none (the default: not yet measured on a GPU since auto "
        "judges what pays)",
        choices=list(SPECULATE),
    )
    _flag(
        p,
        "draft-model",
        str,
        "a smaller model with the model's own tokenizer whose greedy continuations are "
        "drafts too (a directory, a .gguf or a cached repo id; another tokenizer exits 78)",
        metavar="PATH",
    )
    _flag(
        p,
        "prompt-cache-bytes",
        byte_size,
        "KV cache kept for prompt prefixes across requests, LRU (0: none)",
    )
    _flag(
        p,
        "prompt-cache-dir",
        str,
        "a directory (made 0700) where long prompt prefixes' KV is kept across worker "
        "restarts, e.g. ~/.cache/steward/kv",
    )
    _flag(
        p,
        "prompt-cache-disk-bytes",
        byte_size,
        "bytes --prompt-cache-dir may hold, LRU (0: no disk tier)",
    )
    _flag(
        p,
        "responses-store-bytes",
        byte_size,
        "memory for stored Responses (store: true), oldest evicted first (0: none kept)",
    )
    _flag(p, "responses-store-age", float, "seconds a stored Response is kept")
    _flag(
        p,
        "model-kind",
        str,
        "chat: generate; embedding: serve /v1/embeddings; auto: embedding for a "
        "sentence-transformers layout or an encoder (BERT), else chat",
        choices=["auto", "chat", "embedding"],
    )
    _flag(p, "max-embedding-inputs", int, "most inputs one embeddings request may have")
    _flag(p, "max-embedding-tokens", int, "most tokens one embeddings request's inputs have")
    _flag(
        p,
        "ranks",
        int,
        "serve the model over N local ranks of one mx.distributed group (tensor parallel), "
        "supervised as one worker (docs/distributed.md)",
        metavar="N",
    )
    _flag(
        p,
        "hostfile",
        str,
        "serve the model over the hosts of MLX's JSON hostfile (mlx.launch's format), one rank "
        "each: the first is this machine, the others are started over ssh",
        metavar="FILE",
    )
    _flag(
        p,
        "distributed-backend",
        str,
        "the group's MLX backend: any (ring), ring (TCP), nccl (CUDA GPUs, one a rank), jaccl "
        "(RDMA over Thunderbolt, with a hostfile's rdma devices), mpi (ranks started by Open "
        "MPI's mpirun, which must be on PATH)",
        choices=["any", "ring", "jaccl", "nccl", "mpi"],
    )
    _flag(p, "rank-join-timeout", float, "seconds every rank of a group has to join it")
    _flag(
        p,
        "parallel",
        str,
        "how the model is split over the ranks: tensor (mlx-lm's shard()) or pipeline (its "
        "pipeline()); auto: tensor where the model has shard(), else pipeline",
        choices=["auto", "tensor", "pipeline"],
    )
    _flag(p, "inject-fault", str, "fault injection POINT:ACTION[:TRIGGER] (tests, drills)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="steward", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"steward {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    drill.add_parser(sub)
    imp = sub.add_parser(
        "import",
        help="convert a llama-family GGUF to an MLX model dir",
        description="Convert a llama-family GGUF file (F32, F16, Q8_0, Q4_0 or Q4_1 tensors) "
        "into an MLX model directory that `steward serve --model OUT_DIR` serves: "
        "config.json, model.safetensors, tokenizer.json and tokenizer_config.json.",
    )
    imp.add_argument(
        "gguf", type=Path, metavar="FILE.gguf", help="the llama-family GGUF file to convert"
    )
    imp.add_argument(
        "out",
        type=Path,
        nargs="?",
        metavar="OUT_DIR",
        help="the MLX model directory to write (default: FILE without .gguf); "
        "it must not exist yet, or be an empty directory",
    )
    return p


def serve(args: argparse.Namespace) -> int:
    from steward.front.server import serve as run
    from steward.model import kind
    from steward.model.resolve import ModelError
    from steward.ops import logs
    from steward.pool import catalog
    from steward.wire.faultspec import parse_all

    specs = args.model or ([_env("model")] if _env("model") else [])  # the command line wins
    args.model = None  # the models are resolved below
    config = ServeConfig(
        **{f.name: getattr(args, f.name) for f in fields(ServeConfig) if hasattr(args, f.name)}
    )
    logs.setup(config.log_json, config.log_level)
    try:
        config = with_cache_dir(with_key_file(config))
        if not 1 <= config.max_n <= MAX_N:
            raise ValueError(f"--max-n {config.max_n}: must be between 1 and {MAX_N}")
        if config.max_tokens_default < 0:
            raise ValueError(f"--max-tokens-default {config.max_tokens_default}: must be >= 0")
        models = catalog.load(specs, config.models, config.served_model_name)
        models = [
            replace(m, kind=kind.resolve(m.kind or config.model_kind, m.source)) for m in models
        ]
        models = [with_draft(m, config.draft_model) for m in models]
        config = replace(config, model=models[0].path, model_kind=models[0].kind)
        catalog.check_groups(models, config)
        faults = parse_all(config.inject_fault)
        catalog.check_aims(faults, models)
    except (ModelError, ValueError, OSError) as exc:
        logging.getLogger("steward").critical("%s", exc)
        return EX_CONFIG
    return asyncio.run(run(config, models, faults))


def with_draft(model: ModelEntry, default: str | None) -> ModelEntry:
    """A chat model's draft model (its own table's, else `--draft-model`), checked to share
    its tokenizer (ModelError, exit 78) and resolved to an MLX directory."""
    from steward.model.draft import checked

    spec = model.overrides.get("draft_model", default)
    if not spec or model.kind == "embedding":
        return model
    assert model.source is not None
    return replace(model, overrides=model.overrides | {"draft_model": checked(model.source, spec)})


def with_cache_dir(config: ServeConfig) -> ServeConfig:
    """`--prompt-cache-dir`, made (0700) or checked now: an unusable one exits 78. None
    when the disk tier is off."""
    from steward.worker.kvstore import prepare_dir

    if not config.prompt_cache_dir or config.prompt_cache_disk_bytes <= 0:
        return replace(config, prompt_cache_dir=None)
    return replace(config, prompt_cache_dir=str(prepare_dir(config.prompt_cache_dir)))


def with_key_file(config: ServeConfig) -> ServeConfig:
    """`--api-key-file`: the key from the file's first line, never from argv."""
    if not config.api_key_file:
        return config
    lines = Path(config.api_key_file).read_text().splitlines()
    key = lines[0].strip() if lines else ""
    if not key:
        raise ValueError(f"--api-key-file {config.api_key_file}: no key on its first line")
    return replace(config, api_key=key)


def import_gguf(args: argparse.Namespace) -> int:
    from steward.model.gguf import import_gguf as convert
    from steward.model.resolve import ModelError

    out = args.out or args.gguf.with_suffix("")
    try:
        convert(args.gguf, out)
    except (ModelError, OSError) as exc:  # an occupied OUT_DIR included: the message says why
        print(f"steward import: {exc}", file=sys.stderr)
        return EX_CONFIG
    print(out)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    sys.exit({"serve": serve, "import": import_gguf, "drill": drill.main}[args.command](args))
