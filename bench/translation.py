"""What each dialect's translation costs per streamed token, measured in process.

Each dialect's answer (its `seam.Answer`: chat completions, the Responses API, Anthropic
Messages) turns the one answer stream into its wire events. This times exactly that for a
streamed answer of `--tokens` tokens: `opening`, a `delta` per token, `finished` and
`closing`, the dialects taking turns over `--repeats` rounds (each led by another). The rest
of a token's path (the job, SSE framing, the socket) is the same for every dialect, so the
difference from chat completions is what a dialect's translation adds. Printed: microseconds
per token (the median round), and that difference as a share of a token's time on the GPU
(`--token-ms`: the wall time per token of the aggregate stream; on the H200, 1B bf16, about
3.3 ms alone and 0.33 ms at c=32, from bench.throughput), the most decode tok/s the
translation can cost.

    python -m bench.translation [--tokens 2000] [--repeats 9] [--token-ms 3.3,0.33]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from steward.front.dialects.anthropic_answer import MessageAnswer
from steward.front.dialects.chat import ChatAnswer
from steward.front.dialects.chat_schema import ChatRequest
from steward.front.dialects.responses import ResponsesAnswer
from steward.front.dialects.responses_schema import ResponsesRequest
from steward.front.dialects.seam import Answer
from steward.wire.protocol import Done, Token

MODEL = "bench"
ASK = "Tell me a story."


def dialects(n: int) -> dict[str, Callable[[], Answer]]:
    chat = {"messages": [{"role": "user", "content": ASK}], "stream": True, "max_tokens": n}
    responses = {"input": ASK, "stream": True, "max_output_tokens": n}
    return {
        "chat": lambda: ChatAnswer(MODEL, "bench", ChatRequest.model_validate(chat)),
        "responses": lambda: ResponsesAnswer(
            MODEL, ResponsesRequest.model_validate(responses), lambda record: False
        ),
        "messages": lambda: MessageAnswer(MODEL, "bench", n),
    }


def stream(answer: Answer, tokens: list[Token], done: Done) -> int:
    """Every event of one streamed answer, as the front writes them; their bytes."""
    events = answer.opening()
    for i, token in enumerate(tokens):
        events += answer.delta(0, token, i == 0)
    events += answer.finished(0, done, False)
    events += answer.closing([done])
    return sum(len(e) for e in events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--token-ms", default="3.3,0.33", help="a token's GPU time: c=1,c=32")
    args = parser.parse_args()
    n = args.tokens
    tokens = [Token(0, 1000 + i, " word") for i in range(n)]
    done = Done(0, "length", 5, n, 0.01, 300.0)
    makers = dialects(n)
    seen: dict[str, list[float]] = {name: [] for name in makers}
    for repeat in range(args.repeats):
        names = list(makers)
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            answer = makers[name]()
            started = time.perf_counter()
            size = stream(answer, tokens, done)
            seen[name].append((time.perf_counter() - started) / n)
            assert size > n, f"{name}: no events"
    chat = statistics.median(seen["chat"])
    budgets = [float(ms) / 1000 for ms in args.token_ms.split(",")]
    print(f"{n} tokens per answer, median of {args.repeats} rounds")
    header = "".join(f"{f'of {ms * 1000:g} ms':>12}" for ms in budgets)
    print(f"{'dialect':10}{'us/token':>10}{'vs chat':>10}{header}")
    for name, times in seen.items():
        per = statistics.median(times)
        shares = "".join(f"{(per - chat) / ms:>+12.2%}" for ms in budgets)
        print(f"{name:10}{per * 1e6:>10.1f}{(per - chat) * 1e6:>+10.1f}{shares}")


if __name__ == "__main__":
    main()
