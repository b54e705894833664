"""Vision end to end: a tiny random SmolVLM served by a real `steward serve`, images as
data URLs through the official `openai` client, and the front's bounds refusing what is too
big before the worker ever sees it.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import BaseModel

pytest.importorskip("mlx_vlm")

from PIL import Image

from steward.front.images import ImageLimits, prepare
from tests.front.test_openai_api import assert_envelope
from tests.ops.test_observability import samples
from tests.tinyvlm import build_tiny_vlm


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-vlm", default_model_dir)


def image_url(width: int = 64, height: int = 64, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 40)).save(buf, fmt)
    mime = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp", "GIF": "gif"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def ask(*urls: str, text: str = "What is it?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def test_image_and_text_requests_answer(serve, tiny_vlm: Path) -> None:
    server = serve("--model", str(tiny_vlm))
    server.wait()
    client = server.client(max_retries=0)
    for fmt in ("PNG", "JPEG", "WEBP", "GIF"):
        reply = client.chat.completions.create(
            model="default", messages=ask(image_url(fmt=fmt)), max_tokens=4, temperature=0
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens >= 1
    with_image = reply.usage.prompt_tokens
    text_only = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "What is it?"}], max_tokens=4
    )
    assert text_only.usage.completion_tokens >= 1
    assert with_image > text_only.usage.prompt_tokens  # the image's tokens were counted


def test_bounds_refuse_before_the_worker(serve, tiny_vlm: Path, tiny_model: Path) -> None:
    server = serve(
        "--model",
        str(tiny_vlm),
        "--max-images",
        "2",
        "--max-image-pixels",
        "1000000",
        "--max-image-bytes",
        "200000",
    )
    server.wait()
    post = server.http.post
    cases = [
        (ask(image_url(), image_url(), image_url()), 400, "validation_error"),  # count
        (ask(image_url(1001, 1000)), 413, "request_too_large"),  # pixels, from the header
        (ask("data:image/png;base64," + "A" * 300_000), 413, "request_too_large"),  # bytes
        (ask("https://example.com/cat.png"), 400, "validation_error"),  # remote: refused
        (ask("data:image/png;base64,not base64!"), 400, "validation_error"),
        (
            ask("data:image/png;base64," + base64.b64encode(b"no image").decode()),
            400,
            "validation_error",
        ),
        (ask("file:///etc/passwd"), 400, "validation_error"),
    ]
    for messages, status, kind in cases:
        body = {"messages": messages, "max_tokens": 2}
        assert_envelope(post("/v1/chat/completions", json=body), status, kind)
    m = samples(server.http.get("/metrics").text)
    assert m[("steward_time_to_first_token_seconds_count", ())] == 0  # the worker saw none
    text_server = serve("--model", str(tiny_model))
    text_server.wait()
    refused = text_server.http.post("/v1/chat/completions", json={"messages": ask(image_url())})
    assert (
        "does not take images"
        in assert_envelope(refused, 400, "validation_error")["error"]["message"]
    )


def test_front_downscales_to_max_edge() -> None:
    limits = ImageLimits(
        max_edge=128, max_pixels=10**7, max_bytes=10**7, max_images=4, allow_urls=False
    )
    raw = base64.b64decode(image_url(512, 256).split(",", 1)[1])
    assert Image.open(io.BytesIO(prepare(raw, limits))).size == (128, 64)


def test_large_image_allocation_failure_is_survived(serve, default_model_dir, tmp_path) -> None:
    """The field report's trigger: a very large image with --max-edge raised far beyond
    normal, under a worker memory limit, so the failure is a real allocation failure."""
    from tests.supervisor.test_memory_fault import HEADROOM, vm_peak
    from tests.supervisor.test_recovery import faults_logged

    # Image tokens grow with the image's area (no fixed resize): 1536 px is ~30k tokens.
    vlm = build_tiny_vlm(tmp_path / "vlm", default_model_dir, resize=False, context=65536)
    small = {"messages": ask(image_url()), "max_tokens": 2}
    probe = serve("--model", str(vlm))
    pid = probe.wait()["worker"]["pid"]
    assert probe.http.post("/v1/chat/completions", json=small).status_code == 200
    limit = vm_peak(pid) + HEADROOM
    probe.stop()

    server = serve(
        "--model", str(vlm), "--max-edge", "4096", "--log-json", "--worker-memory-limit", str(limit)
    )
    server.wait()
    huge = server.http.post(
        "/v1/chat/completions",
        timeout=300,
        json={"messages": ask(image_url(1536, 1536)), "max_tokens": 2},
    )
    faults = [event["fault"] for event in faults_logged(server.output())]
    classes = {fault["class"] for fault in faults}
    assert faults and classes <= {"worker_crash", "oom"}, (huge.text, faults)
    assert huge.json()["error"]["fault"]["class"] in classes
    if "worker_crash" in classes:  # MLX's allocation: SIGSEGV on this CPU, worker replaced
        assert huge.status_code == 422  # its replay crashed too: quarantined
    else:  # an allocation that raised: the canary proves the worker sound
        assert huge.status_code == 507
    server.wait("degraded")
    for _ in range(2):
        assert server.http.post("/v1/chat/completions", json=small).status_code == 200


def test_remote_image_only_when_allowed(serve, tiny_vlm: Path, tmp_path: Path) -> None:
    """--allow-image-urls fetches http(s) images (here from a loopback server), bounded too."""
    import functools
    import http.server
    import threading

    (tmp_path / "red.png").write_bytes(base64.b64decode(image_url().split(",", 1)[1]))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        server = serve("--model", str(tiny_vlm), "--allow-image-urls")
        server.wait()
        ok = server.http.post(
            "/v1/chat/completions", json={"messages": ask(url + "/red.png"), "max_tokens": 2}
        )
        assert ok.status_code == 200, ok.text
        missing = server.http.post(
            "/v1/chat/completions", json={"messages": ask(url + "/nope.png"), "max_tokens": 2}
        )
        assert_envelope(missing, 400, "validation_error")
    finally:
        httpd.shutdown()


def test_agent_parameters_and_a_resumed_stream(serve, tiny_vlm: Path) -> None:
    """What a text model's answers take, a vision model's take too, through the official
    client: a stream hit by a fault mid-answer resumes to the unfaulted answer, `parse()`
    gets its object, a required tool call its schema's arguments, logprobs and `n` their
    shapes."""
    # The fault is a raise, seen at once: the ceiling only has to spare a step of the vision
    # model under a grammar on a loaded machine (2 s had parse() quarantined as a hang).
    server = serve(
        "--model", str(tiny_vlm), "--stall-timeout", "10", "--inject-fault", "decode:raise:nth=1"
    )
    server.wait()
    client = server.client(max_retries=0)

    def chat(**params: Any) -> Any:
        return client.chat.completions.create(model="default", messages=ask(image_url()), **params)

    def streamed() -> tuple[str, int]:
        chunks = chat(
            max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
        )
        text, usage = "", 0
        for chunk in chunks:
            text += "".join(choice.delta.content or "" for choice in chunk.choices)
            usage = chunk.usage.completion_tokens if chunk.usage else usage
        return text, usage

    faulted = streamed()  # the fault strikes at its second token
    assert faulted == streamed() and faulted[1] == 8
    assert server.health().json()["faults"]["total"] == 1

    class Verdict(BaseModel):
        ok: bool

    parsed = client.chat.completions.parse(
        model="default", messages=ask(image_url()), response_format=Verdict, max_tokens=16
    )
    assert isinstance(parsed.choices[0].message.parsed, Verdict)
    tools = [openai.pydantic_function_tool(Verdict, name="check")]  # strict: no other keys
    called = chat(
        tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=40, n=2
    )
    assert len(called.choices) == 2
    for choice in called.choices:
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "check"
        Verdict.model_validate_json(call.function.arguments)
    scored = chat(max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    content = scored.choices[0].logprobs.content
    assert len(content) == scored.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 2 for entry in content)
