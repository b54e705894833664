"""A group's spare is a whole spare group (docs/distributed.md): real ranks on this CPU,
real MLX collectives, real signals. Hot: every rank of the spare holds its part and the
spare passed the canary, so a faulted group's place is taken by a swap; warm: every rank
has its runtime up and loads its part when the group is promoted.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from msgspec.structs import astuple

from steward.ranks.room import tightest
from steward.supervisor.standby import choose
from steward.wire.protocol import Room
from tests.conftest import Server, until
from tests.ranks.test_ranks import gone, hit_mid_stream, serving_again
from tests.supervisor.test_resume import assert_whole


def group_with(tiny_model: Path, standby: str) -> Server:
    args = ["--model", str(tiny_model), "--ranks", "2", "--standby", standby]
    server = Server([*args, "--queue-timeout", "120"])
    server.wait()
    return server


@pytest.fixture(scope="module")
def hot(tiny_model: Path) -> Iterator[Server]:
    server = group_with(tiny_model, "hot")
    yield server
    server.stop()


def spare_ready(server: Server, besides: set[int] | frozenset[int] = frozenset()) -> dict:
    """/health once a spare group is ready whose ranks are none of `besides`."""
    return server.until(
        lambda h: (
            h["standby"]["state"] == "ready"
            and {r["pid"] for r in h["standby"]["ranks"]}.isdisjoint(besides)
        ),
        within=120,
    )


def pids(ranks: list[dict]) -> set[int]:
    return {r["pid"] for r in ranks}


def promoted(server: Server, fault: signal.Signals) -> tuple[set[int], set[int]]:
    """Rank 1 of the serving group gets `fault` while three streams decode: each ends whole,
    with the answer of an unfaulted run, and the spare group serves in its place. The old
    group's ranks and the promoted group's."""
    health = spare_ready(server)
    old, spare = pids(health["worker"]["ranks"]), pids(health["standby"]["ranks"])
    answers, references, _ = hit_mid_stream(server, fault)
    for seen, reference in zip(answers, references, strict=True):
        assert_whole(seen, reference)
    health = serving_again(server, health["worker"]["generation"])
    assert "promoted standby" in health["faults"]["last"]["action"]
    assert pids(health["worker"]["ranks"]) == spare
    until(lambda: all(gone(pid) for pid in old), 10, "no process of the old group left")
    return old, spare


def test_a_hot_spare_group_is_shown_and_holds_its_parts(hot: Server) -> None:
    health = spare_ready(hot)
    standby, serving = health["standby"], health["worker"]["ranks"]
    assert (standby["mode"], standby["asked"]) == ("hot", "hot")
    assert [(r["rank"], r["host"]) for r in standby["ranks"]] == [
        (0, "127.0.0.1"),
        (1, "127.0.0.1"),
    ]
    assert standby["pid"] == standby["ranks"][0]["pid"]
    assert all(r["alive"] and r["joined"] for r in standby["ranks"])
    assert pids(standby["ranks"]).isdisjoint(pids(serving))


def test_a_spare_group_that_faults_is_killed_whole_and_another_formed(hot: Server) -> None:
    """Its faults are its own: the serving group serves on, and no client sees them."""
    health = spare_ready(hot)
    spare, faults = pids(health["standby"]["ranks"]), health["faults"]["total"]
    os.kill(health["standby"]["ranks"][1]["pid"], signal.SIGKILL)
    until(lambda: all(gone(pid) for pid in spare), 10, "every rank of the spare group gone")
    after = spare_ready(hot, spare)
    assert after["worker"]["generation"] == health["worker"]["generation"]
    assert after["faults"]["total"] == faults


def test_a_killed_rank_has_the_hot_spare_group_promoted(hot: Server) -> None:
    old, spare = promoted(hot, signal.SIGKILL)
    assert spare_ready(hot, old | spare)["standby"]["mode"] == "hot"  # a new one behind it


def test_a_hung_rank_fails_over_to_the_hot_spare_group(hot: Server) -> None:
    old, spare = promoted(hot, signal.SIGSTOP)
    spare_ready(hot, old | spare)


def test_a_warm_spare_group_loads_on_every_rank_when_promoted(tiny_model: Path) -> None:
    """After a killed rank, and after a hung one, whose suspicion has the warm spare group
    load at once (it races the suspect, failover.py); stopping the front leaves no rank of
    either group."""
    server = group_with(tiny_model, "warm")
    try:
        standby = spare_ready(server)["standby"]
        assert standby["mode"] == "warm"
        assert all(r["joined"] and not r["serving"] for r in standby["ranks"])  # no model
        old, spare = promoted(server, signal.SIGKILL)
        health = spare_ready(server, old | spare)
        assert health["standby"]["mode"] == "warm"
        stopped, spare = promoted(server, signal.SIGSTOP)
        health = spare_ready(server, old | stopped | spare)
        assert health["standby"]["mode"] == "warm"
    finally:
        code = server.stop()
    assert code == 0
    left = pids(health["worker"]["ranks"]) | pids(health["standby"]["ranks"])
    until(lambda: all(gone(pid) for pid in left), 10, "no rank of either group left")


def test_auto_counts_the_ranks_on_each_host_and_each_hosts_memory() -> None:
    """The tightest host decides: two ranks here count twice rank 0's part; a remote host's
    memory is its own; one whose memory is not known has no room."""
    gib = 2**30
    assert tightest(gib, [("127.0.0.1", 16 * gib)] * 2) == Room(
        2 * gib, 16 * gib, "on 127.0.0.1 (2 ranks)"
    )
    hosts = [("127.0.0.1", 64 * gib), ("mac2", 8 * gib), ("mac3", 16 * gib)]
    room = tightest(gib, hosts)
    assert room == Room(gib, 8 * gib, "on mac2 (1 rank), the tightest of 3")
    sizes = "two copies of the model take 2.0 of 8.0 GiB on mac2 (1 rank), the tightest of 3"
    assert choose("auto", *astuple(room)) == ("hot", f"auto: {sizes}, within 50%")
    tight = tightest(3 * gib, hosts)  # 6 of mac2's 8 GiB: hot only where asked for
    assert choose("auto", *astuple(tight))[0] == "warm"
    assert choose("hot", *astuple(tight))[0] == "hot"
    unknown = tightest(gib, [("127.0.0.1", 64 * gib), ("mac2", 0)])
    assert (unknown.memory_bytes, unknown.where) == (
        0,
        "on mac2 (1 rank), the tightest of 2, whose memory its ranks have not said",
    )
