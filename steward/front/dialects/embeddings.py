"""OpenAI embeddings, `POST /v1/embeddings`, for a model of kind `embedding`: the inputs
(a string, strings, token ids, or lists of them) into one `Embed` job, its vectors into
OpenAI's `list` of `embedding` objects, as floats or base64 (little-endian float32, which
the OpenAI SDK asks for by default where numpy is installed).

Bounded like every request, before the worker sees it: at most `--max-embedding-inputs`
inputs, none empty, each within the context (its characters, a cheap bound, once the model
is known); the worker refuses exactly what the front cannot know (an input's tokens beyond
the context, `--max-embedding-tokens` in all, `dimensions` the model cannot be cut to).
The job is one like any: an embedding sends nothing before its end, so a fault always
replays it whole, and a poison input is quarantined as a poison prompt is.
"""

from __future__ import annotations

import array
import base64
import sys
from typing import Annotated, Any, Literal

from fastapi import Request, Response
from pydantic import Field, StrictInt, StrictStr

from steward.errors import ApiError
from steward.front import backend
from steward.front.dialects.delivery import Waiter, whole
from steward.front.dialects.exchange import dialect_router, served_model, start_job
from steward.front.dialects.openai import MAX_NAME_CHARS, Schema
from steward.front.docs import IGNORED, error_responses
from steward.supervisor.jobs import Job
from steward.wire.protocol import Done, Embed, Vectors

TokenId = Annotated[StrictInt, Field(ge=0, lt=2**31)]
Input = StrictStr | list[StrictStr] | list[TokenId] | list[list[TokenId]]


class EmbeddingRequest(Schema):
    input: Input
    model: str | None = Field(None, max_length=256)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=MAX_NAME_CHARS)  # accepted, no effect

    def inputs(self) -> list[str | list[int]]:
        """One text or one list of token ids per input."""
        given = self.input
        if isinstance(given, str) or (given and isinstance(given[0], int)):
            return [given]  # type: ignore[list-item]
        return list(given)  # type: ignore[arg-type]


def checked(request: Request, inputs: list[str | list[int]]) -> list[str | list[int]]:
    """The inputs within the bounds the front knows, or the 400 that names the one past them."""
    limit = request.app.state.config.max_embedding_inputs
    if not inputs:
        raise ApiError("validation_error", "input: must not be empty", param="input")
    if len(inputs) > limit:
        raise ApiError(
            "validation_error",
            f"input: {len(inputs)} inputs, more than {limit} (--max-embedding-inputs)",
            param="input",
        )
    bound = backend.supervisor(request).prompt_bound  # the pool's, for the model named
    for i, item in enumerate(inputs):
        if not item:
            raise ApiError("validation_error", f"input[{i}]: must not be empty", param="input")
        if bound is None:
            continue
        # token ids are tokens; a text has at least `bound.least_tokens` of its characters
        tokens = len(item) if isinstance(item, list) else bound.least_tokens(len(item))
        if tokens > bound.context_length:
            raise ApiError(
                "context_length_exceeded",
                f"input[{i}]: at least {tokens} tokens, more than this model's maximum "
                f"context length of {bound.context_length}",
                param="input",
            )
    return inputs


def vectors(embedding: Vectors, encoding: str) -> list[list[float]] | list[str]:
    """Each input's vector: floats, or its little-endian float32 bytes in base64."""
    size = 4 * embedding.dimensions
    rows = [embedding.data[i : i + size] for i in range(0, len(embedding.data), size)]
    if encoding == "base64":
        return [base64.b64encode(row).decode() for row in rows]
    floats = []
    for row in rows:
        values = array.array("f", row)
        if sys.byteorder == "big":
            values.byteswap()
        floats.append(values.tolist())
    return floats


def answer(model: str, encoding: str, done: Done) -> dict[str, Any]:
    assert done.embedding is not None
    data = [
        {"object": "embedding", "index": i, "embedding": vector}
        for i, vector in enumerate(vectors(done.embedding, encoding))
    ]
    usage = {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


router = dialect_router()


@router.post(
    "/embeddings",
    responses={200: {"headers": IGNORED}, **error_responses(400, 404, 422, 429, 504, 507)},
)
async def embeddings(request: Request, body: EmbeddingRequest) -> Response:
    model = served_model(request, body.model, kind="embedding")
    inputs = checked(request, body.inputs())
    payload = Embed(id=0, seq=0, attempt=0, inputs=inputs, dimensions=body.dimensions)
    longest = max((len(item) for item in inputs if isinstance(item, str)), default=0)
    job = start_job(request, model, payload, longest)

    def full(jobs: list[Job], dones: list[Done]) -> dict[str, Any]:
        return answer(model, body.encoding_format, dones[0])

    return await whole(request, [Waiter(request, job)], full)
