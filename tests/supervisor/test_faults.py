"""Fault classification from real backend messages, and fault-spec parsing (SPEC §3, §6)."""

from __future__ import annotations

import pytest

from steward.supervisor.faults import classify
from steward.supervisor.intensity import RestartIntensity
from steward.wire.faultspec import FaultSpec, Periods, parse, parse_all
from steward.wire.process import describe_exit
from steward.worker.injection import GPU_TIMEOUT, OUT_OF_MEMORY, Injector


@pytest.mark.parametrize(
    ("message", "cls"),
    [
        (
            "RuntimeError: [METAL] Command buffer execution failed: Caused GPU Timeout Error "
            "(00000002:kIOGPUCommandBufferCallbackErrorTimeout)",
            "gpu_timeout",
        ),
        (
            "RuntimeError: [METAL] Command buffer execution failed: Insufficient Memory "
            "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
            "oom",
        ),
        (
            "RuntimeError: [metal::malloc] Attempting to allocate 85899345920 bytes which is "
            "greater than the maximum allowed buffer size of 77309411328 bytes.",
            "oom",
        ),
        ("RuntimeError: cudaMallocAsync(&data, size, stream) failed: out of memory", "oom"),
        ("RuntimeError: [Event::wait] Resource limit exceeded", "oom"),
        ("MemoryError: ", "oom"),
        ("std::bad_alloc", "oom"),
        (
            "RuntimeError: [METAL] Command buffer execution failed: Internal Error "
            "(0000000e:Internal Error)",
            "gpu_error",
        ),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "gpu_error"),
        ("RuntimeError: cudaErrorLaunchFailure", "gpu_error"),
        (
            "ValueError: [matmul] Last dimension of first input with shape (1,5) must match",
            "backend_error",
        ),
        (GPU_TIMEOUT, "gpu_timeout"),
        (OUT_OF_MEMORY, "oom"),
    ],
)
def test_classify(message: str, cls: str) -> None:
    assert classify(message) == cls


def test_describe_exit() -> None:
    assert describe_exit(-11) == "killed by SIGSEGV"
    assert describe_exit(-6) == "killed by SIGABRT"
    assert describe_exit(1) == "exited with status 1"


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("decode:poison:nth=3", FaultSpec("decode", "poison", nth=3)),
        ("load:poison:every", FaultSpec("load", "poison", nth=None)),
        ("prefill:raise:marker=BOOM", FaultSpec("prefill", "raise", nth=None, marker="BOOM")),
        ("decode:slow=0.5", FaultSpec("decode", "slow", 0.5, nth=1)),
        ("prefill:crash", FaultSpec("prefill", "crash", nth=1)),
        ("decode:hang:period=100+40", FaultSpec("decode", "hang", 0, None, None, 100.0, 40.0)),
        ("supervisor:crash:nth=2", FaultSpec("supervisor", "crash", nth=2)),
        ("decode:crash:nth=5@40", FaultSpec("decode", "crash", nth=5, token=40)),
        ("verify:slow=0.05:every", FaultSpec("verify", "slow", 0.05, nth=None)),
    ],
)
def test_parse(text: str, spec: FaultSpec) -> None:
    assert parse(text) == spec


@pytest.mark.parametrize(
    "text",
    [
        "decode",
        "gpu:raise",
        "decode:explode",
        "decode:slow",
        "decode:raise:nth=0",
        "decode:raise:sometimes",
        "load:raise:marker=X",
        "decode:raise:marker=",
        "load:raise:period=10",
        "decode:raise:period=0",
        "decode:raise:period=5+x",
        "supervisor:hang",
        "prefill:crash:nth=5@40",
        "decode:crash:nth=5@1",
        "decode:crash:nth=5@x",
        "verify:slow=0.05",
        "verify:raise:every",
    ],
)
def test_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="fault spec"):
        parse(text)


def test_periods_arm_one_request_per_period(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("steward.wire.faultspec.time.monotonic", lambda: clock[0])
    periods = Periods(parse_all(["decode:raise:period=100+20;decode:crash:period=100+40"]))
    seen = []
    for now in (1000, 1021, 1022, 1041, 1100, 1121, 1141, 1300, 1300.5, 1301):
        clock[0] = now
        seen.append(periods.arm())
    # from the first request on; two falling due together get a request each, in turn
    assert seen == [[], [0], [], [1], [], [0], [1], [0], [1], []]


def test_an_armed_spec_fires_on_its_first_attempt_only() -> None:
    injector = Injector(parse_all(["decode:raise:period=60"]), generation=1)
    injector.hit("decode", seq=5, attempt=1, armed=[])  # not armed: nothing
    injector.hit("decode", seq=5, attempt=2, armed=[0])  # the replay: nothing
    with pytest.raises(RuntimeError, match="GPU Timeout"):
        injector.hit("decode", seq=5, attempt=1, armed=[0])


def test_parse_all_splits_on_semicolons() -> None:
    assert len(parse_all(["decode:raise:nth=2;prefill:hang:nth=5", "load:crash"])) == 3


def test_restart_intensity() -> None:
    intensity = RestartIntensity(max_restarts=2, window=60)
    assert intensity.allow() and intensity.allow()
    assert not intensity.allow()
    assert intensity.in_window() == 2
    expired = RestartIntensity(max_restarts=1, window=0)
    assert expired.allow() and expired.allow()


def test_nth_at_a_token_fires_mid_answer_only() -> None:
    injector = Injector([parse("decode:raise:nth=3@5")], generation=1)
    for token in (2, 3, 4, 6):
        injector.hit("decode", 3, 1, token=token)  # not its 5th token: nothing
    injector.hit("decode", 4, 1, token=5)  # another request's 5th: nothing
    with pytest.raises(RuntimeError, match="GPU Timeout"):
        injector.hit("decode", 3, 1, token=5)
    injector.hit("decode", 3, 2, token=5)  # its replay is not faulted again
