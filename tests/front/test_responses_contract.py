"""The contract's parameter tables against the official SDK's own signatures: a parameter of
`responses.create` or `chat.completions.create` that docs/dialects/responses.md does not
list fails here, so a new SDK release shows up as a failing test, not as a user's 400. Every
`responses.create` parameter is also a field steward reads (honoured, a no-op or a 400 that
names it: never "unrecognized")."""

from __future__ import annotations

import inspect
import re

import pytest
from openai.resources.chat.completions import Completions
from openai.resources.responses import Responses

from steward.front.dialects.responses_schema import ResponsesRequest
from tests.conftest import ROOT

DOC = ROOT / "docs" / "dialects" / "responses.md"
CLIENT_ONLY = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
ROW = re.compile(r"^\| `([a-z_]+)` \|", re.MULTILINE)


def sdk_parameters(method: object) -> list[str]:
    return [name for name in inspect.signature(method).parameters if name not in CLIENT_ONLY]


def table(heading: str) -> list[str]:
    """The parameters a section's table lists, in order."""
    text = DOC.read_text()
    start = text.index(f"## `{heading}` parameters")
    end = text.find("\n## ", start + 1)
    return ROW.findall(text[start : end if end > 0 else None])


@pytest.mark.parametrize(
    ("heading", "method"),
    [("responses.create", Responses.create), ("chat.completions.create", Completions.create)],
)
def test_the_table_lists_every_parameter_the_sdk_accepts(heading: str, method: object) -> None:
    listed = table(heading)
    missing = [name for name in sdk_parameters(method) if name not in listed]
    assert not missing, f"docs/dialects/responses.md: {heading} lacks {missing}"
    assert listed == sorted(listed) and len(set(listed)) == len(listed)


def test_every_responses_parameter_is_read_on_purpose() -> None:
    unread = [p for p in sdk_parameters(Responses.create) if p not in ResponsesRequest.model_fields]
    assert not unread, f"ResponsesRequest does not read {unread}"


def test_the_stream_helper_adds_only_client_side_parameters() -> None:
    extra = set(sdk_parameters(Responses.stream)) - set(sdk_parameters(Responses.create))
    assert extra <= {"response_id", "text_format", "starting_after"}, extra
