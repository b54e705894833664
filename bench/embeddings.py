"""Embeddings: inputs per second through `steward serve` against the bare model forward.

The same tiny random decoder embedder (tests/tinyembed.py, built with the default model's
tokenizer) both ways. Bare: `Embedder.forward` in this process, on batches of `--batch`
inputs. Steward: a real server (HTTP front + worker), `--clients` concurrent clients each
posting requests of `--batch` inputs, so the worker batches across requests. Prints both
rates and their ratio.

    python -m bench.embeddings [--inputs 512] [--batch 16] [--clients 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

TEXT = "An input of a few words, as a retrieval index embeds its passages, number {}."


def texts(n: int) -> list[str]:
    return [TEXT.format(i) * (1 + i % 3) for i in range(n)]


def bare(model_dir: Path, inputs: list[str], batch: int) -> float:
    """Inputs/s of the forward alone (tokenising and pooling included, as the worker does)."""
    from steward.wire.protocol import Embed
    from steward.worker.embedder import Embedder
    from steward.worker.injection import Injector

    embedder = Embedder(model_dir, Injector([], 1), 10**9)
    groups = [inputs[i : i + batch] for i in range(0, len(inputs), batch)]
    embedder.forward(embedder.prepare(Embed(0, 0, 0, groups[0])))  # warm
    started = time.perf_counter()
    for group in groups:
        ids = embedder.prepare(Embed(0, 0, 0, group))
        embedder.finish(embedder.forward(ids), None)
    return len(inputs) / (time.perf_counter() - started)


def served(model_dir: Path, inputs: list[str], batch: int, clients: int) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "steward", "serve", "--model", str(model_dir), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=300) as http:
            while True:
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            groups = [inputs[i : i + batch] for i in range(0, len(inputs), batch)]
            http.post("/v1/embeddings", json={"input": groups[0]})  # warm
            started = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                codes = list(
                    pool.map(lambda g: http.post("/v1/embeddings", json={"input": g}), groups)
                )
            seconds = time.perf_counter() - started
            assert all(r.status_code == 200 for r in codes)
    finally:
        server.terminate()
        server.wait(30)
    return len(inputs) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    from steward.model.gguf import materialize
    from steward.model.resolve import resolve_model
    from tests.tinyembed import build_tiny_embedder

    os.environ.setdefault("STEWARD_CACHE_DIR", tempfile.mkdtemp())
    tokenizer_dir = materialize(resolve_model(None))
    model_dir = build_tiny_embedder(Path(tempfile.mkdtemp()) / "tiny-embed", tokenizer_dir)
    inputs = texts(args.inputs)
    base = bare(model_dir, inputs, args.batch)
    ours = served(model_dir, inputs, args.batch, args.clients)
    print(f"bare forward  {base:8.1f} inputs/s (batches of {args.batch})")
    print(f"steward       {ours:8.1f} inputs/s ({args.clients} clients x {args.batch} inputs)")
    print(f"ratio         {ours / base:8.2f}")


if __name__ == "__main__":
    main()
