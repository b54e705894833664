"""OpenAI text completions, `POST /v1/completions`: one prompt, its `text_completion`
answer or stream, log-probabilities in the legacy shape (tokens and text offsets)."""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response
from pydantic import Field, model_validator

from steward.front.dialects.exchange import dialect_router, exchange, served_model
from steward.front.dialects.openai import (
    MAX_N,
    MAX_TOP_LOGPROBS,
    OpenAIAnswer,
    Sampling,
    Tokens,
    choices,
    finite,
)
from steward.front.dialects.seam import Ask
from steward.front.docs import generation_responses
from steward.supervisor.jobs import Job
from steward.wire.protocol import Done, Logprob, Token


class CompletionRequest(Sampling):
    prompt: str | list[str]
    max_tokens: Tokens | None = 16  # OpenAI's default; null: `--max-tokens-default`
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    @model_validator(mode="after")
    def _completion(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt: one prompt per request (a list of prompts is not supported)")
        if not self.text():
            raise ValueError("prompt: must not be empty")
        if self.echo or self.suffix or (self.best_of or self.n) != self.n:
            raise ValueError("not supported by steward: echo, suffix, best_of other than n")
        return self

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def params(self) -> dict[str, Any]:
        logprobs = -1 if self.logprobs is None else self.logprobs
        return {
            "prompt": self.text(),
            "max_tokens": self.max_tokens,
            "logprobs": logprobs,
            **self.sampling(),
        }


class TextAnswer(OpenAIAnswer):
    object = chunk_object = "text_completion"
    prefix = "cmpl-"

    def __init__(self, model: str, request_id: str, body: CompletionRequest) -> None:
        super().__init__(model, request_id, body.include_usage(), body.logprobs is not None)
        self.offsets: dict[int, int] = {}  # choice -> characters of text sent

    def choice(self, index: int, job: Job, done: Done) -> dict[str, Any]:
        text = "".join(job.text)
        logprobs = self._logprobs(index, job.logprobs)
        return {"index": index, "text": text, "logprobs": logprobs, **self._end(done)}

    def delta(self, index: int, token: Token, first: bool) -> list[str]:
        logprobs = self._logprobs(index, [token.logprob]) if token.logprob else None
        choice = {"index": index, "text": token.text, "logprobs": logprobs, **self._end(None)}
        return [self.chunk(self.object, choice, None)]

    def finished(self, index: int, done: Done, first: bool) -> list[str]:
        choice = {"index": index, "text": "", "logprobs": None, **self._end(done)}
        return [self.chunk(self.object, choice, done)]

    @staticmethod
    def _end(done: Done | None) -> dict[str, str | None]:
        return {"finish_reason": done.finish_reason if done else None}

    def _logprobs(self, index: int, entries: list[Logprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        offset = self.offsets.get(index, 0)
        offsets = []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry.token)
        self.offsets[index] = offset
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [finite(e.logprob) for e in entries],
            "top_logprobs": [{t.token: finite(t.logprob) for t in e.top} for e in entries],
            "text_offset": offsets,
        }


router = dialect_router()


@router.post("/completions", responses=generation_responses("text_completion"))
async def completions(request: Request, body: CompletionRequest) -> Response:
    model = served_model(request, body.model)
    ask = Ask.of(body.params(), len(body.text()), body.stream, choices(request, body))
    return await exchange(request, model, ask, TextAnswer(model, request.state.request_id, body))
