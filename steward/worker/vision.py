"""The mlx-vlm backend: `Backend`'s interface and fault points, for vision-language models.

Images reach the worker already validated and downscaled by the front, as encoded bytes
(PNG/JPEG) in the request's `images` list, in the order of the `{"type": "image"}` parts of
its messages; already-decoded PIL images are accepted as well (tests, in-process callers).
The worker never sees a URL or a path: mlx-vlm is only ever handed PIL images.

Preprocessing (decode, resize, tiling, image-token expansion) runs before the prefill fault
point, with mlx-vlm's own `prepare_inputs`, so the prompt's true token count (image tokens
included) is known and checked against the context before any model code runs.

What shapes an answer is the text backend's (`Shaping`): the sampler, the logits processor
(`logit_bias`, penalties, a grammar), log-probabilities and tool calls, handed to mlx-vlm's
generation. A resumed answer's tokens follow the prompt, as in the batch.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.utils import load_config, load_tokenizer
from mlx_vlm import apply_chat_template, load, stream_generate
from mlx_vlm.utils import prepare_inputs, should_add_special_tokens
from PIL import Image, UnidentifiedImageError

from steward.wire.protocol import Admitted, Done, Generate, Rejected, Step, prompt_text
from steward.worker.answer import Answer
from steward.worker.backend import (
    PREPARE_ERRORS,
    Shaping,
    context_length,
    max_token_chars,
    over_context,
    unpreparable,
)
from steward.worker.injection import Injector
from steward.worker.sampling import sampler

Emit = Callable[[Step], None]

ImageInput = bytes | Image.Image


@dataclass
class Prepared:
    """A request turned into model inputs by mlx-vlm's processor."""

    input_ids: mx.array
    pixel_values: mx.array | None
    mask: mx.array | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return int(self.input_ids.size)


class BadImage(ValueError):
    """An image the worker cannot decode: a request problem, not a backend fault."""


def decode_image(data: ImageInput) -> Image.Image:
    if isinstance(data, Image.Image):
        image = data
    else:
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            raise BadImage(f"image could not be decoded: {exc}") from exc
    return image if image.mode == "RGB" else image.convert("RGB")


def image_parts(req: Generate) -> int:
    """How many `{"type": "image"}` parts the messages hold (a completion prompt has none)."""
    return sum(
        isinstance(part, dict) and part.get("type") in ("image", "image_url", "input_image")
        for message in req.messages or []
        if isinstance(content := message.get("content"), list)
        for part in content
    )


class VisionBackend(Shaping):
    batches = False  # mlx-vlm batches few models: requests run alone, in order

    def __init__(self, model_dir: Path, injector: Injector) -> None:
        self.injector = injector
        injector.hit("load")
        self.model, self.processor = load(str(model_dir))
        eos = load_config(model_dir).get("eos_token_id")  # as mlx-lm's own `load` finds it
        super().__init__(self.model, load_tokenizer(model_dir, eos_token_ids=eos))
        stops = getattr(self.processor, "tokenizer", self.processor).stopping_criteria
        self.end_tokens |= set(stops.eos_token_ids)  # all that mlx-vlm stops on
        self.context_length = context_length(model_dir)
        self.max_token_chars = max_token_chars(self.tokenizer)

    def prompt(self, req: Generate, n_images: int) -> str:
        """The chat template applied by mlx-vlm (it knows each family's message format)."""
        if req.messages is None:
            return req.prompt or ""
        return apply_chat_template(
            self.processor,
            self.model.config,
            req.messages,
            num_images=n_images,
            **self.template_options(req),
        )

    def prepare(self, req: Generate, images: Sequence[ImageInput] = ()) -> Prepared:
        decoded = [decode_image(image) for image in images]
        inputs = prepare_inputs(
            self.processor,
            images=decoded or None,
            prompts=self.prompt(req, len(decoded)),
            image_token_index=getattr(self.model.config, "image_token_index", None),
            add_special_tokens=should_add_special_tokens(
                self.model.config.model_type, self.processor
            ),
        )
        tensors = ("input_ids", "pixel_values", "attention_mask")
        extra = {k: v for k, v in inputs.items() if k not in tensors}
        return Prepared(
            inputs["input_ids"], inputs.get("pixel_values"), inputs.get("attention_mask"), extra
        )

    def generate(
        self,
        req: Generate,
        emit: Emit,
        cancelled: Callable[[], bool],
        images: Sequence[ImageInput] | None = None,
    ) -> Done | Rejected:
        """`images` defaults to `req.images`; in-process callers may pass PIL images."""
        images = req.images if images is None else images
        try:
            return self._generate(req, emit, cancelled, images)
        finally:
            # MLX keeps freed buffers cached; under an address-space limit a rejected
            # huge image's pixel buffers would otherwise crowd out the next request.
            mx.clear_cache()

    def _generate(
        self,
        req: Generate,
        emit: Emit,
        cancelled: Callable[[], bool],
        images: Sequence[ImageInput],
    ) -> Done | Rejected:
        start = time.perf_counter()
        if (parts := image_parts(req)) != len(images):
            message = f"the messages have {parts} image parts but {len(images)} images came"
            return Rejected(req.id, "validation_error", message)
        try:
            inputs = self.prepare(req, images)
        except BadImage as exc:
            return Rejected(req.id, "validation_error", str(exc))
        except PREPARE_ERRORS as exc:
            return unpreparable(req, exc)
        if rejected := over_context(req, self.context_length, inputs.prompt_tokens):
            return rejected
        try:
            processor = self.logits_processor(req)
        except ValueError as exc:
            return Rejected(req.id, "validation_error", str(exc))
        answer = self.answer(req, inputs.input_ids.flatten().tolist())
        if cancelled():  # the client left while it waited its turn: no prefill for no one
            sent = len(req.resume)
            return done(req, "cancelled", inputs.prompt_tokens, answer, sent, start, start)
        room = self.context_length - inputs.prompt_tokens
        left = (req.max_tokens or room) - len(req.resume)
        # Preprocessing done (a slow image is not a stall); mlx-vlm prefills the prompt and
        # the resumed tokens whole, with no prompt cache, and says nothing until it is done.
        prefill = inputs.prompt_tokens + len(req.resume) if left >= 1 else 0
        emit(Step(prefilled=[req.id], admitted=[Admitted(req.id, prefill)]))
        self.injector.hit("prefill", req.seq, req.attempt, prompt_text(req), req.armed)
        if left < 1:  # the fault struck after the last token: nothing is left to do
            return done(req, "length", inputs.prompt_tokens, answer, len(req.resume), start, start)
        resumed = mx.array(list(req.resume), inputs.input_ids.dtype).reshape(1, -1)
        outputs = stream_generate(
            self.model,
            self.processor,
            "",
            input_ids=mx.concatenate([inputs.input_ids, resumed], axis=1),
            pixel_values=inputs.pixel_values,
            mask=None if req.resume else inputs.mask,
            **inputs.extra,
            max_tokens=left,
            sampler=sampler(req, position=len(req.resume)),
            logits_processors=[processor] if processor is not None else None,
        )
        # mlx-vlm yields one result per generated token, then a final one (finish_reason
        # set) carrying only the detokenizer's flushed text: not a token.
        return self.relay(req, outputs, inputs.prompt_tokens, answer, start, emit, cancelled)

    def relay(
        self,
        req: Generate,
        outputs: Iterable[Any],
        prompt_tokens: int,
        answer: Answer,
        start: float,
        emit: Emit,
        cancelled: Callable[[], bool],
    ) -> Done:
        """mlx-vlm's tokens to one `Step` each and a `Done`: the answer's text (from the
        answer's detokenizer, which has seen the resumed tokens: mlx-vlm's own starts
        afresh), thinking, tool calls and log-probabilities, the decode fault point,
        cancellation and timings (one request at a time: mlx-vlm does not batch every model,
        so vision requests run alone)."""
        marked = prompt_text(req)
        first, count, finish = start, len(req.resume), None
        for step, out in enumerate(outputs):
            real = out.finish_reason is None
            if step == 0:
                first = time.perf_counter()
            if real and count:  # not the answer's first token
                self.injector.hit("decode", req.seq, req.attempt, marked, req.armed)
            count += real
            ended = None if real else ("stop" if out.finish_reason == "stop" else "length")
            piece = answer.feed(int(out.token) if real else None, ended)
            finish = piece.finish
            logprob = None
            if real and req.logprobs >= 0:
                (logprob,) = self.logprobs.rows([(int(out.token), req.logprobs, out.logprobs)])
            if real or not piece.empty:
                emit(Step(tokens=[piece.token(req.id, int(out.token) if real else -1, logprob)]))
            if finish:
                break
            if cancelled():
                finish = "cancelled"
                break
        return done(req, finish or "length", prompt_tokens, answer, count, start, first)


def done(
    req: Generate,
    finish: str,
    prompt_tokens: int,
    answer: Answer,
    count: int,
    start: float,
    first: float,
) -> Done:
    """`count` tokens in all, resumed ones included; the speed is this attempt's."""
    elapsed = time.perf_counter() - first
    new = count - len(req.resume)
    return Done(
        req.id,
        finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=count,
        ttft=first - start,
        decode_tps=(new - 1) / elapsed if new > 1 and elapsed > 0 else 0.0,
        reasoning_tokens=answer.reasoning_tokens,
        stop_sequence=answer.stop_sequence,
    )
