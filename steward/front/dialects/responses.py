"""OpenAI Responses, `/v1/responses` (issue 21)."""

from __future__ import annotations

from steward.front.dialects.exchange import dialect_router

router = dialect_router()
