"""The pool's decisions where a load, an eviction, a failure and a stop meet, over fake
worker lines (one `Script` per model), in milliseconds: the orders that real processes
reach only by chance.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.model.resolve import ModelSource
from steward.pool import budget
from steward.pool.catalog import ModelEntry
from steward.pool.pool import Pool
from steward.pool.snapshot import ModelState
from steward.supervisor.faults import FaultClass
from steward.supervisor.jobs import Job
from steward.wire.protocol import Generate
from steward.wire.settings import WorkerSettings
from tests.supervisor.fakelink import TOKENS, FakeLink, Script
from tests.supervisor.harness import answered, outcome, run, until

GIB = 2**30


def pool_of(tmp_path: Path, scripts: dict[str, Script], **config: object) -> Pool:
    """Models named as `scripts`, the first the default, each 1 GiB of weights (needing
    1.2 GiB), under a budget that fits two of them."""
    entries = []
    for name in scripts:
        weights = tmp_path / f"{name}.gguf"
        with weights.open("wb") as f:
            f.truncate(GIB)  # sparse: its size is all the budget reads
        source = ModelSource("gguf", weights, name)
        entries.append(ModelEntry(name, str(weights), source=source))
    settings = {
        "memory_budget": 3 * GIB,
        "prompt_cache_bytes": 0,
        "standby": "none",
        "stall_timeout": 0.3,
        "on_model_failed": "serve",
        **config,
    }

    async def spawn(settings: WorkerSettings) -> FakeLink:
        return await scripts[settings.source.model_id].spawn(settings)

    return Pool(ServeConfig(**settings), entries, [], spawn)


def ask(pool: Pool, name: str, i: int = 1) -> Job:
    """A request for `name` through the pool, as a handler makes it."""
    supervisor = pool.supervisor(pool.find(name))
    request = Generate(id=0, seq=0, attempt=0, max_tokens=TOKENS, prompt=f"prompt {i}")
    return supervisor.submit(request, 8, f"req-{i}", f"payload-{i}", False)


def state(pool: Pool, name: str) -> ModelState:
    return pool.find(name).state(pool.stopping)


def test_a_sigterm_while_a_load_waits_for_memory_drains_at_once(tmp_path):
    """The load waits for an eviction's stop that will not end soon: nothing will ever run
    its queue, so its requests get the shutdown's 503 now, not at the drain timeout."""

    async def scenario() -> None:
        held = asyncio.Event()
        scripts = {"a": Script(retire=held), "b": Script(), "c": Script()}
        pool = pool_of(tmp_path, scripts)
        pool.start()
        await answered(ask(pool, "a"))
        await answered(ask(pool, "b"))  # a is now the least recently used
        waiting = ask(pool, "c")  # evicts a, whose worker does not retire
        assert state(pool, "a") is ModelState.UNLOADING and not scripts["c"].links
        try:
            await asyncio.wait_for(pool.stop(30.0, asyncio.Event()), 2.0)
        finally:
            held.set()  # a failing test must not hang on the worker it holds
        _, end = await outcome(waiting)
        assert isinstance(end, ApiError) and end.type == "server_shutdown"
        assert not scripts["c"].links  # nothing loaded after the stop
        await pool.close()

    run(scenario)


TICKS = 50  # event-loop turns, not seconds: what the fake link does, it does within them


def test_a_load_waits_for_a_failed_models_workers_to_retire(tmp_path):
    """A model whose restart budget is spent is failed at once, but its workers (here its
    warm spare) hold memory until they are gone: the next load must not start beside them."""

    async def scenario() -> None:
        held = asyncio.Event()
        scripts = {"a": Script(faults={1: [FaultClass.WORKER_CRASH]}), "b": Script()}
        pool = pool_of(tmp_path, scripts, max_restarts=0, standby="warm")
        pool.start()
        await until(lambda: len(scripts["a"].links) == 2)  # serving, and its spare
        scripts["a"].links[1].retire = held
        _, end = await outcome(ask(pool, "a"))
        assert isinstance(end, ApiError) and end.type == "backend_unavailable"
        await until(lambda: state(pool, "a") is ModelState.FAILED)
        job = ask(pool, "b")
        await until(lambda: state(pool, "b") is ModelState.LOADING)  # b's load is taken
        for _ in range(TICKS):  # a load started at once has its worker by then
            await asyncio.sleep(0)
        started_beside = bool(scripts["b"].links)
        held.set()
        assert not started_beside and not job.finished
        await answered(job)
        assert all(link.killed for link in scripts["a"].links)
        assert pool.exit_code is None  # b serves on
        await pool.close()

    run(scenario)


def test_an_eviction_whose_stop_fails_still_closes_its_workers(tmp_path):
    async def scenario() -> None:
        scripts = {"a": Script(), "b": Script(), "c": Script()}
        pool = pool_of(tmp_path, scripts)
        pool.start()
        await answered(ask(pool, "a"))
        await answered(ask(pool, "b"))
        victim = pool.find("a").supervisor
        assert victim is not None

        async def broken(drain_timeout: float, cut: asyncio.Event) -> None:
            raise RuntimeError("the stop failed")

        victim.stop = broken  # type: ignore[method-assign]
        await answered(ask(pool, "c"))
        assert all(link.killed for link in scripts["a"].links)
        assert state(pool, "a") is ModelState.UNLOADED
        await pool.close()

    run(scenario)


def test_a_model_learns_what_its_worker_measured_as_it_comes_up(tmp_path):
    """The first worker's measures (the model's size, the device's memory, `auto`'s hot
    spare chosen from them) are the slot's from the moment the model serves: the budget's
    next plan counts them with no health read to fetch them first."""

    async def scenario() -> None:
        scripts = {"a": Script(model_bytes=GIB // 4), "b": Script()}
        pool = pool_of(tmp_path, scripts, memory_budget=None, standby="auto")
        a = pool.find("a")
        assert a.need() == budget.need(GIB, 0, 1)  # its weights on disk, one copy
        pool.start()
        await until(lambda: state(pool, "a") is ModelState.READY)
        assert a.need() == budget.need(GIB // 4, 0, 2)  # measured, and a hot spare's copy
        assert pool.memory_budget() == budget.default_budget(scripts["a"].memory_bytes)
        await pool.close()

    run(scenario)
