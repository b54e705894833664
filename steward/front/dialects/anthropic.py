"""Anthropic Messages, `POST /v1/messages` and `/v1/messages/count_tokens` (issue 21).

Errors under /v1/messages are already written in Anthropic's envelope
(steward/errors.py `AnthropicEnvelope`), routes or not.
"""

from __future__ import annotations

from steward.front.dialects.exchange import dialect_router

router = dialect_router()
