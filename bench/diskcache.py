"""A long-context stream crashed mid-answer, with and without the prompt cache's disk tier:
the worst gap between two of its content deltas, which is the resume's silence.

Each run is a real `steward serve` (a hot spare ready, `--inject-fault
decode:crash:nth=1@K`): one greedy stream with a prompt of about `--context` tokens is
crashed at its K-th token and resumed on the spare. Without the disk tier the spare
prefills the whole context again; with it (`--prompt-cache-dir`, a fresh directory), it
loads the prompt's KV, saved when its prefill ended. Printed per run: the worst gap, the
resumed stream's `cached_tokens`, and the ratio of the two gaps (target: with the disk
tier at most 1/4 of without).

The model is `--model`, else a random float32 llama (hidden 128, 4 layers, the default
model's tokenizer) built here: a 3,000-token prefill costs it seconds on a small CPU.

    python -m bench.diskcache [--model DIR] [--context 3000] [--tokens 64] [--crash-at 32]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bench.client import Streamed, pooled, stream_chat
from bench.overhead import bench_model, start_server
from bench.recovery import gaps, spare_ready

TARGET = 0.25  # with / without


def prompt(tokens: int) -> str:
    """About `tokens` tokens of log lines (about 17 tokens a line)."""
    lines = max(1, tokens // 17)
    return " ".join(
        f"Log entry {i}: the keeper trimmed the lamp and wound the clock." for i in range(lines)
    )


def random_model(folder: Path) -> Path:
    from tests.tinymodel import build_tiny_model

    tokenizer = bench_model(None)
    return build_tiny_model(folder / "llama", tokenizer, hidden=128, layers=4, context=8192)


def run(model: Path, args: argparse.Namespace, cache_dir: str | None) -> Streamed:
    flags = ["--standby", "hot", "--inject-fault", f"decode:crash:nth=1@{args.crash_at}"]
    if cache_dir is not None:
        flags += ["--prompt-cache-dir", cache_dir]
    proc, url = start_server(model, flags)
    try:
        spare_ready(url, "hot")
        body = {
            "messages": [{"role": "user", "content": prompt(args.context)}],
            "max_tokens": args.tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

        async def one() -> Streamed | str:
            async with pooled(url, 1) as client:
                return await stream_chat(client, body)

        seen = asyncio.run(one())
    finally:
        proc.terminate()
        proc.wait()
    if isinstance(seen, str) or seen.usage is None or len(seen.times) < 2:
        raise SystemExit(f"the stream did not end whole: {seen}")
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: a random llama)")
    parser.add_argument("--context", type=int, default=3000, help="prompt tokens, about")
    parser.add_argument("--tokens", type=int, default=64, help="the answer's tokens")
    parser.add_argument("--crash-at", type=int, default=32, help="the token the crash strikes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = args.model or random_model(Path(folder))
        without = run(model, args, None)
        with_disk = run(model, args, str(Path(folder) / "kv"))
    print(f"{'run':12}{'prompt':>8}{'cached':>8}{'tokens':>8}{'worst gap s':>13}")
    for name, seen in (("without", without), ("with disk", with_disk)):
        usage = seen.usage or {}
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        print(
            f"{name:12}{usage.get('prompt_tokens', 0):>8}{cached:>8}"
            f"{usage.get('completion_tokens', 0):>8}{max(gaps(seen)):>13.3f}"
        )
    ratio = max(gaps(with_disk)) / max(gaps(without))
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"ratio with/without {ratio:.3f} (target <= {TARGET}: {verdict})")


if __name__ == "__main__":
    main()
