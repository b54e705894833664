"""Structured outputs and forced tool calls: the grammar the answer must match.

A JSON answer (chat's `response_format` `json_object` and `json_schema`, strict or not,
the schema is enforced), and a forced tool call (`tool_choice` `required` or a named
function), in whichever dialect, become one llguidance grammar, checked
here so that a schema llguidance cannot compile is the request's 400 naming what is
unsupported. The worker compiles it again against its tokenizer and masks every token the
grammar forbids: the answer matches with any model, in a batch, in a stream, and after a
resume (the grammar is fed the tokens the client already has).

A grammar is compiled off the event loop (`grammar_off_loop`): a large schema takes
llguidance long enough to stall every other request's stream.

JSON is compiled without free whitespace (`{"a": 1, "b": [2, 3]}` as `json.dumps` writes
it): a small model let loose on optional whitespace can fill its whole budget with it.
`oneOf` is treated as `anyOf` (Pydantic's discriminated unions are `oneOf` with a `const`
discriminator, for which the two are the same).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import llguidance

from steward.errors import ApiError

OPTIONS = {"whitespace_flexible": False, "coerce_one_of": True}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    """What the worker gets: the grammar, and how the answer carries tool calls (which the
    worker finds, and where parallel calls are not allowed cuts to the first)."""

    grammar: str | None = None
    calls: str = ""  # "", "auto", "named", "list" (see worker/toolcalls.py)
    call_name: str = ""
    parallel: bool = True

    def params(self) -> dict[str, Any]:
        return {
            "grammar": self.grammar,
            "calls": self.calls,
            "call_name": self.call_name,
            "parallel_calls": self.parallel,
        }


async def constraint(
    tools: dict[str, dict[str, Any] | None],
    choice: str,
    name: str = "",
    parallel: bool = True,
    schema: dict[str, Any] | None = None,
) -> Constraint:
    """The grammar and tool-call mode of any dialect's request; ApiError if a schema cannot
    compile. `tools`: each function's parameters schema by name; `choice`: `none`, `auto`,
    `required`, or `named` (the function `name`); `parallel`: more than one call allowed;
    `schema`: what a JSON answer must match (`ANY_OBJECT` for any JSON object), None for
    free text."""
    if choice == "named":
        params = tools[name] or ANY_OBJECT
        compiled = await grammar_off_loop(params, f"tools.{name}.parameters")
        return Constraint(compiled, "named", name)
    if choice == "required":
        calls = {
            "type": "array",
            "minItems": 1,
            "items": {"anyOf": [_call_schema(n, params) for n, params in tools.items()]},
        }
        if not parallel:
            calls["maxItems"] = 1
        return Constraint(await grammar_off_loop(calls, "tools"), "list", parallel=parallel)
    if choice == "auto":
        return Constraint(calls="auto", parallel=parallel)
    if schema is None:
        return Constraint()
    return Constraint(await grammar_off_loop(schema, "response_format"))


def _call_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": parameters or ANY_OBJECT},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


async def grammar_off_loop(schema: dict[str, Any], where: str) -> str:
    """`grammar`, on a thread: the event loop goes on serving the other requests."""
    return await asyncio.to_thread(grammar, schema, where)


def grammar(schema: dict[str, Any], where: str) -> str:
    try:
        compiled = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=OPTIONS)
    except ValueError as exc:
        raise ApiError("validation_error", f"{where}: not a JSON schema: {exc}") from None
    if error := llguidance.LLMatcher.validate_grammar(compiled):
        raise ApiError("validation_error", f"{where}: the schema is not supported: {error}")
    return compiled
