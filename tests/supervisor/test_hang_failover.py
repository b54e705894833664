"""A hang seen from the worker's own step clock and failed over on suspicion; a slow step
never taken for one (SPEC §3), end to end: a real server, real workers, real MLX on the tiny
model, eight streams at once, a hot spare (test_failover.py covers every branch with fake
worker lines).

Each stream's gaps between events are printed (`pytest -s`): the worst is a measure, not
an assert.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.supervisor.test_resume import assert_whole, stream
from tests.supervisor.test_standby import alive

STREAMS = 8
TOKENS = 24


def eight_streams(server) -> list[dict]:
    """Eight streams at once, each whole and unbroken as its unfaulted run is (greedy)."""
    prompts = [f"Question {i}: what is a lighthouse?" for i in range(STREAMS)]
    with ThreadPoolExecutor(STREAMS) as pool:
        faulted = list(pool.map(lambda prompt: stream(server.url, prompt, TOKENS), prompts))
    for prompt, seen in zip(prompts, faulted, strict=True):
        assert_whole(seen, stream(server.url, prompt, TOKENS))
    print(f"worst gap between events: {max(seen['gap'] for seen in faulted):.2f} s")
    return faulted


def test_a_hang_among_eight_streams_fails_over_to_the_spare(serve, tiny_model) -> None:
    """The third request's step hangs at its sixth token: every stream is silent until the
    hot spare takes over, at the bound, long before `--stall-timeout` (the ceiling); the
    suspect is killed at the ceiling, a `stall` counted once."""
    server = serve(
        "--model", str(tiny_model), "--standby", "hot", "--stall-timeout", "10",
        "--inject-fault", "decode:hang:nth=3@6",
    )  # fmt: skip
    server.wait()
    spare = server.until(lambda health: health["standby"]["state"] == "ready", 60)["standby"]
    first = server.health().json()["worker"]["pid"]
    eight_streams(server)
    health = server.health().json()
    assert health["worker"]["pid"] == spare["pid"], health  # failed over, not restarted
    health = server.until(lambda h: h["faults"]["total"] == 1 and not h["suspects"], within=60)
    last = health["faults"]["last"]
    assert last["class"] == "stall" and last["generation"] == 1, last
    assert "promoted standby" in last["action"] and "killed at the ceiling" in last["action"]
    assert health["restarts_in_window"] == 1
    assert not alive(first)  # killed


def test_one_slow_step_of_a_healthy_worker_spends_no_restart(serve, tiny_model) -> None:
    """One step of 4 s: past the bound (a CPU's floor is 3 s), so the spare may take over;
    the worker then steps: slow, not hung. Nothing is counted, nothing spent."""
    server = serve(
        "--model", str(tiny_model), "--standby", "hot",
        "--inject-fault", "decode:slow=4:nth=3@6",
    )  # fmt: skip
    server.wait()
    server.until(lambda health: health["standby"]["state"] == "ready", 60)
    eight_streams(server)
    health = server.until(lambda health: not health["suspects"], within=60)
    assert health["faults"]["total"] == 0, health
    assert health["restarts_in_window"] == 0, health
    health = server.until(lambda health: health["standby"]["state"] == "ready", 60)
    assert health["status"] == "ready", health
