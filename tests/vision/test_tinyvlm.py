"""A tiny random SmolVLM through mlx-vlm's real loading, preprocessing and generation code.

Skipped where mlx-vlm is not installed (`scripts/setup.sh` installs it).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlx_vlm")

from PIL import Image

from steward.front.structured import grammar as compile_schema
from steward.wire.faultspec import parse
from steward.wire.protocol import (
    Cancel,
    Done,
    Generate,
    Rejected,
    Step,
    decode_to_worker,
    encode,
)
from steward.worker.answer import segments
from steward.worker.injection import Injector
from steward.worker.vision import VisionBackend
from tests.tinyvlm import IMAGE_SEQ_LEN, build_tiny_vlm

ASK = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-vlm", default_model_dir)


@pytest.fixture(scope="module")
def backend(tiny_vlm: Path) -> VisionBackend:
    return VisionBackend(tiny_vlm, Injector([], 1))


def png(size: int = 64, color: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    image = Image.new("RGB", (size, size), color)
    for x in range(size // 2):
        image.putpixel((x, x), (10, 200, 10))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def prompt_ids(backend: VisionBackend, req: Generate, images: list[bytes] = ()) -> list[int]:
    """Prompt token ids, image tokens expanded as the model will see them."""
    return [int(t) for t in backend.prepare(req, images).input_ids.reshape(-1).tolist()]


def run(backend: VisionBackend, req: Generate, **kwargs: Any) -> tuple[Done | Rejected, list[Step]]:
    sent: list[Step] = []
    return backend.generate(req, sent.append, lambda: False, **kwargs), sent


def tokens(sent: list[Step]) -> list[int]:
    return [t.token for step in sent for t in step.tokens if t.token >= 0]


def test_mlx_vlm_loads_the_tiny_vlm(tiny_vlm: Path) -> None:
    from mlx_vlm import load

    model, processor = load(str(tiny_vlm))
    assert model.config.model_type == "smolvlm"
    assert type(processor).__name__ == "SmolVLMProcessor"
    assert processor.image_seq_len == IMAGE_SEQ_LEN
    assert processor.tokenizer.convert_tokens_to_ids("<image>") == model.config.image_token_id


def test_image_and_text(backend: VisionBackend) -> None:
    req = Generate(id=1, seq=1, attempt=1, max_tokens=6, messages=ASK, images=[png()])
    req = decode_to_worker(encode(req))  # images travel through the real protocol
    done, sent = run(backend, req)
    assert isinstance(done, Done), done
    assert (done.finish_reason, done.completion_tokens) == ("length", 6)
    assert sent[0].prefilled == [req.id]  # preprocessing done: progress, not a stall
    assert len(tokens(sent)) == 6
    ids = prompt_ids(backend, req, req.images)
    # a 64x64 image: 2x2 tiles of 32 plus the global one, IMAGE_SEQ_LEN tokens each
    assert ids.count(backend.model.config.image_token_id) == 5 * IMAGE_SEQ_LEN
    assert done.prompt_tokens == len(ids)
    # greedy is deterministic; a decoded PIL image gives the same answer as its PNG bytes
    pil = Image.open(io.BytesIO(png()))
    again, sent2 = run(backend, req, images=[pil])
    assert tokens(sent2) == tokens(sent)
    assert again.prompt_tokens == done.prompt_tokens


def test_text_only(backend: VisionBackend) -> None:
    hi = [{"role": "user", "content": "Hi"}]
    chat = Generate(id=2, seq=2, attempt=1, max_tokens=5, messages=hi)
    done, sent = run(backend, chat)
    assert isinstance(done, Done) and done.completion_tokens == 5
    assert backend.model.config.image_token_id not in prompt_ids(backend, chat)
    completion = Generate(id=3, seq=3, attempt=1, max_tokens=4, prompt="Once upon a time")
    done, sent = run(backend, completion)
    assert isinstance(done, Done) and done.completion_tokens == 4
    text = "".join(t.text for step in sent for t in step.tokens)
    assert text


def test_request_problems_are_rejected(backend: VisionBackend) -> None:
    req = Generate(id=4, seq=4, attempt=1, max_tokens=4, messages=ASK)
    done, _ = run(backend, req, images=[b"not an image"])
    assert isinstance(done, Rejected) and done.type == "validation_error"
    done, _ = run(backend, req, images=[])
    assert isinstance(done, Rejected) and "1 image parts but 0 images" in done.message
    long = Generate(id=5, seq=5, attempt=1, max_tokens=backend.context_length, messages=ASK)
    done, _ = run(backend, long, images=[png()])
    assert isinstance(done, Rejected) and done.type == "context_length_exceeded"


@pytest.mark.parametrize("point", ["prefill", "decode"])
def test_fault_points(backend: VisionBackend, point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "injector", Injector([parse(f"{point}:raise")], 1))
    req = Generate(id=6, seq=1, attempt=1, max_tokens=3, messages=ASK)
    with pytest.raises(RuntimeError, match="GPU Timeout"):
        run(backend, req, images=[png()])


def test_a_resumed_answer_continues_from_the_tokens_sent(backend: VisionBackend) -> None:
    """SPEC §3: after a fault, a stream the client reads continues from exactly the tokens
    it was sent (greedy: what the unfaulted answer had next), usage counted once."""
    ask = {"seq": 7, "attempt": 1, "max_tokens": 8, "messages": ASK, "images": [png()]}
    whole, sent = run(backend, Generate(id=7, **ask))
    answer = tokens(sent)
    assert isinstance(whole, Done) and len(answer) == whole.completion_tokens == 8
    resumed, rest = run(backend, Generate(id=8, **ask, resume=answer[:3]))
    assert tokens(rest) == answer[3:]
    before = "".join(segments(backend.tokenizer.detokenizer, answer[:3]))  # the client has it
    assert text(sent) == before + text(rest)
    assert isinstance(resumed, Done) and resumed.completion_tokens == 8
    ended, after = run(backend, Generate(id=9, **ask, resume=answer))  # after the last token
    assert isinstance(ended, Done) and (ended.finish_reason, tokens(after)) == ("length", [])


def test_the_agent_parameters_shape_a_vision_answer(backend: VisionBackend) -> None:
    """A schema, a forced tool call, `logit_bias` and logprobs: what a text model's answer
    takes (the processor, sampler and tool calls are the text backend's)."""
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    grammar = compile_schema(schema, "test")
    ask = {"seq": 10, "attempt": 1, "messages": ASK, "images": [png()]}
    done, sent = run(backend, Generate(id=10, max_tokens=16, grammar=grammar, logprobs=3, **ask))
    assert isinstance(done, Done) and done.finish_reason == "stop"
    assert json.loads(text(sent)) in ({"ok": True}, {"ok": False})
    chosen = [t for step in sent for t in step.tokens if t.token >= 0]
    for token in chosen:
        tops = token.logprob.top
        assert len(tops) == 3 and sum(math.exp(top.logprob) for top in tops) <= 1 + 1e-4
        assert token.logprob.token in {top.token for top in tops}  # greedy: the best
    resumed = Generate(id=14, max_tokens=16, grammar=grammar, resume=tokens(sent)[:2], **ask)
    again, after = run(backend, resumed)  # the grammar follows the tokens the client has
    assert tokens(after) == tokens(sent)[2:] and again.finish_reason == "stop"
    _, plain = run(backend, Generate(id=11, max_tokens=4, **ask))
    first = tokens(plain)[0]
    _, banned = run(backend, Generate(id=12, max_tokens=4, logit_bias={first: -100.0}, **ask))
    assert first not in tokens(banned)
    called, sent = run(
        backend,
        Generate(id=13, max_tokens=16, grammar=grammar, calls="named", call_name="check", **ask),
    )
    calls = [call for step in sent for t in step.tokens for call in t.calls]
    assert isinstance(called, Done) and called.finish_reason == "tool_calls"
    assert calls[0].name == "check" and text(sent) == ""
    assert json.loads("".join(call.arguments for call in calls)) in ({"ok": True}, {"ok": False})


def text(sent: list[Step]) -> str:
    return "".join(t.text for step in sent for t in step.tokens)


def test_a_cancel_taken_from_the_inbox_is_spent(backend: VisionBackend) -> None:
    """After a fault the supervisor cancels the request at the worker, then replays it with
    the same id: the replay runs to its end, unless a second cancel (the client's, for the
    replay) came, even before the first was taken: then it never reaches the model."""
    from steward.worker.inbox import Inbox
    from steward.worker.main import Cancels, _serve_alone

    def replay(cancels: int) -> Done:
        inbox = Inbox()
        cancelled = Cancels()
        for _ in range(cancels):  # the reader has them all already
            cancelled.received(14)
        replayed = Generate(id=14, seq=14, attempt=2, max_tokens=4, prompt="Hi")
        for msg in (Cancel(14), replayed, *[Cancel(14)] * (cancels - 1), None):
            inbox.put(msg)
        sent: list = []
        _serve_alone(backend, inbox, cancelled, sent.append)
        assert 14 not in cancelled  # every cancel spent
        (done,) = [done for step in sent if isinstance(step, Step) for done in step.done]
        return done

    assert (replay(1).finish_reason, replay(1).completion_tokens) == ("length", 4)
    assert (replay(2).finish_reason, replay(2).completion_tokens) == ("cancelled", 0)
