"""steward's serving overhead: the same model, the same prompt, in the same run.

Baseline: bare `mlx_lm.stream_generate` in this process. Steward: a real `steward serve`
(HTTP front + worker process), streamed over SSE. Runs alternate between the two so drift
hits both; medians are compared. Prints decode tokens/s and time to first token for each,
the decode ratio (target >= 0.97) and the TTFT overhead (target <= 10 ms).

    python bench/overhead.py [--model DIR] [--tokens 64] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx

from bench.client import NODELAY

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def bare_run(model, tokenizer, prompt: list[int], tokens: int) -> tuple[float, float, int]:
    from mlx_lm import stream_generate

    started = time.perf_counter()
    times = [time.perf_counter() for _ in stream_generate(model, tokenizer, prompt, tokens)]
    return measure(started, times)


def steward_run(client: httpx.Client, tokens: int) -> tuple[float, float, int, dict]:
    """Client-side (TTFT, decode tok/s, tokens), plus the worker's own `timings`."""
    body = {"messages": MESSAGES, "max_tokens": tokens, "temperature": 0, "stream": True}
    times, timings = [], {}
    started = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                choice = chunk["choices"][0]
                if choice["delta"].get("content"):  # one per token, as bare's yields
                    times.append(time.perf_counter())
                timings = chunk.get("timings", timings)
    return (*measure(started, times), timings)


def client(url: str) -> httpx.Client:
    """A keep-alive client with TCP_NODELAY, as a latency-minded SDK would use."""
    return httpx.Client(
        base_url=url, transport=httpx.HTTPTransport(socket_options=NODELAY), timeout=300
    )


def measure(started: float, times: list[float]) -> tuple[float, float, int]:
    """(time to first token, decode tokens/s after the first, tokens)."""
    ttft = times[0] - started
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return ttft, decode, len(times)


def bench_model(path: Path | None) -> Path:
    """The model a benchmark runs: `--model`, or the embedded default, imported once."""
    if path is not None:
        return path
    from steward.model.gguf import materialize
    from steward.model.resolve import resolve_model

    return materialize(resolve_model(None))


def start_server(
    model: Path | None,
    args: list[str] = (),
    stderr: IO[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """A real `steward serve` on a free port, once it is ready (its log to `stderr`; `env`:
    variables added to this process's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model_args = ["--model", str(model)] if model else []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "steward",
            "serve",
            *model_args,
            "--port",
            str(port),
            "--log-level",
            "warning",
            *args,
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stderr=stderr,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(6000):
        if proc.poll() is not None:
            raise SystemExit(f"steward exited {proc.returncode} before becoming ready")
        try:
            if httpx.get(url + "/health/ready").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("steward did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: the default model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from mlx_lm import load

    model_dir = bench_model(args.model)
    model, tokenizer = load(str(model_dir))
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    proc, url = start_server(model_dir)
    http = client(url)
    try:
        bare_run(model, tokenizer, prompt, 8)  # warm both paths up
        steward_run(http, 8)
        bare, served = [], []
        for _ in range(args.runs):
            bare.append(bare_run(model, tokenizer, prompt, args.tokens))
            served.append(steward_run(http, args.tokens))
    finally:
        proc.terminate()
        proc.wait(60)

    def med(runs: list[tuple], i: int, key: str | None = None) -> float:
        return statistics.median(r[i][key] if key else r[i] for r in runs)

    b_ttft, b_tps, s_ttft, s_tps = med(bare, 0), med(bare, 1), med(served, 0), med(served, 1)
    w_ttft, w_tps = med(served, 3, "prompt_ms") / 1e3, med(served, 3, "predicted_per_second")
    print(
        f"model: {model_dir}  prompt tokens: {len(prompt)}  max tokens: {args.tokens}  "
        f"runs: {args.runs}  tokens: bare {med(bare, 2):.0f}, steward {med(served, 2):.0f}"
    )
    print(f"{'':32}{'TTFT ms':>10}{'decode tok/s':>15}")
    print(f"{'bare mlx_lm, in process':32}{b_ttft * 1e3:>10.1f}{b_tps:>15.1f}")
    print(f"{'steward, as the client sees it':32}{s_ttft * 1e3:>10.1f}{s_tps:>15.1f}")
    print(f"{'steward worker, its own clock':32}{w_ttft * 1e3:>10.1f}{w_tps:>15.1f}")
    print(f"decode ratio (steward client / bare): {s_tps / b_tps:.3f}   (target >= 0.97)")
    print(
        f"TTFT overhead (steward client - bare): {(s_ttft - b_ttft) * 1e3:+.1f} ms   "
        "(target <= 10 ms)"
    )
    print(f"  HTTP + IPC part (client - worker clock): {(s_ttft - w_ttft) * 1e3:+.1f} ms")


if __name__ == "__main__":
    main()
