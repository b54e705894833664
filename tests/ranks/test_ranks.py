"""A model over two local `ring` ranks, supervised as one worker (docs/distributed.md): real
ranks, real MLX collectives on this CPU, real signals.

The tiny llama is float32: its tensor-sharded forward (each rank half the heads and half
the MLP, summed across ranks) gives the same greedy tokens as one process; in bfloat16 the
sums' rounding differs and greedy answers part after a few tokens.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import mlx.core as mx
import pytest

from steward.ranks.group import GRACE, SILENCE, WATCH
from tests.conftest import ROOT, Server, free_port, until
from tests.supervisor.test_resume import assert_whole, stream

PROMPTS = ["Tell me about lighthouses.", "Name three rivers.", "Why is the sky blue?"]
LONG = 48  # tokens a faulted stream asks for: long enough to be hit mid-answer
SERVING = ("ready", "degraded")


@pytest.fixture(scope="module")
def group(tiny_model: Path) -> Iterator[Server]:
    # no spare: a faulted group is re-formed (a spare group's promotion: test_standby.py)
    args = ["--model", str(tiny_model), "--ranks", "2", "--standby", "none"]
    server = Server([*args, "--queue-timeout", "120"])
    server.wait()
    yield server
    server.stop()


def ranks(server: Server) -> list[dict]:
    return server.health().json()["worker"]["ranks"]


def every_rank_serving(server: Server) -> list[dict]:
    """The ranks once each says it serves (rank 1 says so a pulse after the group is ready)."""
    serving = server.until(lambda h: all(r["serving"] for r in h["worker"]["ranks"]), within=10)
    return serving["worker"]["ranks"]


def gone(pid: int) -> bool:
    """Exited and reaped: no process (not even a zombie) has the pid."""
    return not Path(f"/proc/{pid}").exists()


def completion(url: str, prompt: str, stream_it: bool) -> str:
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": stream_it}
    if not stream_it:
        return httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0][
            "text"
        ]
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text += httpx.Response(200, content=line[6:]).json()["choices"][0]["text"]
    return text


def dialects(url: str, prompt: str) -> dict[str, str]:
    """The greedy answer to `prompt` in the chat, Anthropic and Responses dialects."""
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    said = [{"role": "user", "content": prompt}]
    ask = {"model": model, "temperature": 0}
    chat = httpx.post(
        url + "/v1/chat/completions", json={**ask, "messages": said, "max_tokens": 16}, timeout=120
    ).json()
    anthropic = httpx.post(
        url + "/v1/messages", json={**ask, "messages": said, "max_tokens": 16}, timeout=120
    ).json()
    responses = httpx.post(
        url + "/v1/responses", json={**ask, "input": prompt, "max_output_tokens": 16}, timeout=120
    ).json()
    (message,) = [item for item in responses["output"] if item["type"] == "message"]
    return {
        "chat": chat["choices"][0]["message"]["content"],
        "anthropic": anthropic["content"][0]["text"],
        "responses": message["content"][0]["text"],
    }


def test_greedy_answers_equal_one_process(group: Server, serve, tiny_model: Path) -> None:
    one = serve("--model", str(tiny_model), "--standby", "none")
    one.wait()
    same_as_one_process(group, one)


def same_as_one_process(group: Server, one: Server) -> list[dict]:
    """Both ranks of `group` serving, and its greedy answers those of `one` (the model in a
    single process), streamed and not, in every dialect; the ranks, as /health lists them."""
    listed = every_rank_serving(group)
    assert [r["rank"] for r in listed] == [0, 1]
    assert all(r["alive"] and r["joined"] for r in listed)
    for prompt in PROMPTS:
        expected = completion(one.url, prompt, False)
        assert len(expected) > 0
        assert completion(group.url, prompt, False) == expected
        assert completion(group.url, prompt, True) == expected
        answers = dialects(one.url, prompt)
        assert all(answers.values()), answers
        assert dialects(group.url, prompt) == answers
        assert stream(group.url, prompt)["text"] == stream(one.url, prompt)["text"]
    return listed


def rank_series(server: Server) -> dict[str, float]:
    """/metrics' per-rank samples, by name and labels as exposed."""
    text = httpx.get(server.url + "/metrics").text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("steward_rank_")
    }


def sample(name: str, **labels: object) -> str:
    """A sample's name as /metrics writes it (its labels sorted)."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_metrics_are_labelled_per_rank(group: Server) -> None:
    """After the answers above: each rank alive, serving and stepped, by rank and host."""
    series = rank_series(group)
    for rank in (0, 1):
        assert series[sample("steward_rank_alive", rank=rank, host="127.0.0.1")] == 1.0
        assert series[sample("steward_rank_serving", rank=rank, host="127.0.0.1")] == 1.0
        assert series[sample("steward_rank_steps_total", rank=rank, host="127.0.0.1")] > 0
        assert sample("steward_rank_since_progress_seconds", rank=rank, host="127.0.0.1") in series


# Held while a group is faulted and re-formed: two groups re-forming at once, from the suite's
# two workers, each with the next group's ranks starting beside it, starve each other's
# collectives on two cores past the stall bound (an mpi rank spins in a collective).
FAULTING = Path(tempfile.gettempdir()) / "steward-tests-group-fault.lock"


def hit_mid_stream(
    server: Server, fault: signal.Signals, tokens: int = LONG, prompts: list[str] = PROMPTS
) -> tuple[list[dict], list[dict], float]:
    """Streams of `tokens` decoding, one for each of `prompts`, when rank 1 gets `fault`:
    what each client saw, each prompt's unfaulted answer, and how long the group took to be
    seen faulted. One test worker at a time faults a group (`FAULTING`)."""
    with FAULTING.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return _hit_mid_stream(server, fault, tokens, prompts)


def _hit_mid_stream(
    server: Server, fault: signal.Signals, tokens: int, prompts: list[str]
) -> tuple[list[dict], list[dict], float]:
    references = [stream(server.url, prompt, tokens) for prompt in prompts]
    before = server.health().json()
    victim = before["worker"]["ranks"][1]["pid"]
    started = [threading.Event() for _ in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        seen = [
            pool.submit(stream, server.url, prompt, tokens, event)
            for prompt, event in zip(prompts, started, strict=True)
        ]
        # every stream has its first token (seen by its client: a look at /health, slow
        # on a loaded machine, can fall between two streams' ends)
        assert all(event.wait(60) for event in started), "every stream decoding"
        steps = server.health().json()["worker"]["ranks"][0]["steps"]
        # two steps more with every stream in the batch: tokens are on their way to each
        server.until(lambda h: h["worker"]["ranks"][0]["steps"] >= steps + 2, within=60)
        os.kill(victim, fault)
        hit = time.monotonic()
        server.until(lambda h: h["faults"]["total"] > before["faults"]["total"], within=30)
        noticed = time.monotonic() - hit
        answers = [future.result(timeout=180) for future in seen]
    return answers, references, noticed


def serving_again(server: Server, generation: int) -> dict:
    """/health once a later group than `generation` serves, each of its ranks too (degraded:
    the fault is in the restart window)."""
    return server.until(
        lambda h: (
            h["worker"]["generation"] > generation
            and h["status"] in SERVING
            and all(r["serving"] for r in h["worker"]["ranks"])
        ),
        within=120,
    )


def test_sigkill_of_rank_1_mid_stream_reforms_the_group(group: Server) -> None:
    generation = group.health().json()["worker"]["generation"]
    old = ranks(group)
    answers, references, noticed = hit_mid_stream(group, signal.SIGKILL)
    for seen, reference in zip(answers, references, strict=True):
        assert_whole(seen, reference)
    print(f"a killed rank seen faulted {noticed:.2f} s after SIGKILL (bound {GRACE + WATCH} s)")
    assert noticed < GRACE + WATCH + 2.0  # the slack: a poll of /health on a loaded machine
    health = serving_again(group, generation)
    new = health["worker"]["ranks"]
    assert {r["pid"] for r in new}.isdisjoint({r["pid"] for r in old})
    assert all(r["alive"] and r["joined"] and r["serving"] for r in new)
    assert all(gone(r["pid"]) for r in old)  # no process of the old group is left
    assert f"rank 1 (pid {old[1]['pid']}) killed by SIGKILL" in group.output()


def test_sigstop_of_rank_1_is_seen_within_its_bound(group: Server) -> None:
    generation = group.health().json()["worker"]["generation"]
    old = ranks(group)
    answers, references, noticed = hit_mid_stream(group, signal.SIGSTOP)
    for seen, reference in zip(answers, references, strict=True):
        assert_whole(seen, reference)
    bound = SILENCE + WATCH + GRACE
    print(f"a stopped rank seen faulted {noticed:.2f} s after SIGSTOP (bound {bound:.1f} s)")
    assert noticed < bound + 2.0  # the slack: a poll of /health on a loaded machine
    serving_again(group, generation)
    until(lambda: gone(old[1]["pid"]), 10, "the stopped rank killed and reaped")
    assert gone(old[0]["pid"])
    assert f"rank 1 (pid {old[1]['pid']}) silent for" in group.output()


def test_the_field_reports_loop_after_a_rank_fault(group: Server) -> None:
    """The field report's 70 requests, sent as rank 1 dies: each waits for the new group
    and is answered."""
    generation = group.health().json()["worker"]["generation"]
    os.kill(ranks(group)[1]["pid"], signal.SIGKILL)
    body = {"prompt": "Count on.", "max_tokens": 4, "temperature": 0}
    statuses = [
        httpx.post(group.url + "/v1/completions", json=body, timeout=180).status_code
        for _ in range(70)
    ]
    assert statuses == [200] * 70
    assert group.health().json()["worker"]["generation"] > generation


def test_a_rank_that_never_joins_fails_the_bring_up(serve, tiny_model: Path) -> None:
    server = serve("--model", str(tiny_model), "--ranks", "2", "--rank-join-timeout", "8")
    stopped: set[int] = set()
    done = threading.Event()

    def stop_rank_1() -> None:
        """SIGSTOP every group's rank 1 before it joins (a host that hangs at start)."""
        while not done.is_set():
            try:
                listed = server.health().json()["worker"].get("ranks") or []
            except (httpx.TransportError, ValueError):
                listed = []
            for rank in listed:
                if rank["rank"] == 1 and not rank["joined"] and rank["pid"] not in stopped:
                    os.kill(rank["pid"], signal.SIGSTOP)
                    stopped.add(rank["pid"])
            time.sleep(0.05)

    started = time.monotonic()
    watcher = threading.Thread(target=stop_rank_1, daemon=True)
    watcher.start()
    try:
        code = server.exit_code(timeout=120)
    finally:
        done.set()
    took = time.monotonic() - started
    assert code == 75, server.output()
    assert "did not join within 8 s" in server.output()
    assert len(stopped) == 3  # the first group, and the two replacements a bring-up is given
    assert all(gone(pid) for pid in stopped)
    print(f"bring-up failed in {took:.1f} s over {len(stopped)} groups")


def test_sigterm_drains_a_group_and_leaves_no_rank(serve, tiny_model: Path) -> None:
    server = serve("--model", str(tiny_model), "--ranks", "2")
    server.wait()
    pids = [r["pid"] for r in ranks(server)]
    drained_mid_stream(server, LONG)
    assert all(gone(pid) for pid in pids)


def drained_mid_stream(server: Server, tokens: int) -> None:
    """SIGTERM while a stream of `tokens` decodes: it ends whole, and the front exits 0."""
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(stream, server.url, PROMPTS[0], tokens)
        server.until(lambda h: h["in_flight"] == 1, within=60)
        server.proc.send_signal(signal.SIGTERM)
        seen = answer.result(timeout=120)
    assert seen["done"] and seen["errors"] == [] and seen["finish"] == "length"
    assert server.exit_code(timeout=60) == 0


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--distributed-backend", "jaccl"], "jaccl joins hosts over RDMA: give a --hostfile"),
        (["--distributed-backend", "nccl"], "--distributed-backend nccl: MLX"),
        (["--ranks", "3"], "the model's attention heads do not divide over 3 ranks"),
        (["--parallel", "pipeline"], "--parallel pipeline: a llama model has no pipeline()"),
        (
            ["--parallel", "pipeline", "--distributed-backend", "nccl"],
            "--parallel pipeline needs send and recv, which the nccl backend lacks",
        ),
    ],
)
def test_what_cannot_be_built_exits_78_saying_why(tiny_model: Path, args, why) -> None:
    """Flags checked before anything starts; a model the ranks cannot split (the tiny
    llama's 4 heads over 3 ranks; no pipeline() in mlx-lm's llama), or a backend this build
    of MLX lacks (nccl, CUDA's, on this CPU), said by rank 0 while the others hold."""
    if args == ["--distributed-backend", "nccl"] and mx.distributed.is_available("nccl"):
        pytest.skip("this build of MLX has nccl")
    argv = [sys.executable, "-m", "steward", "serve", "--model", str(tiny_model), "--ranks", "2"]
    port = ["--port", str(free_port())]
    done = subprocess.run(
        [*argv, *port, *args], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 78, done.stderr
    assert why in done.stderr
