"""One engine, many dialects: each module here is one wire dialect over the one internal
request (`Generate`) and its one answer stream (`Token`s, then `Done`).

A dialect is a file with a `router` (from `exchange.dialect_router()`) that app.py
includes, and two translations: its body into a `seam.Ask`, and a
`seam.Answer` that writes the jobs' events as its response and stream frames.
`exchange.exchange` does the rest (model names, the default cap, deadlines, replay before
the first event, resume, cancellation), so every guarantee holds in every dialect. Errors
are written in the dialect's envelope, chosen by path (steward/errors.py `ENVELOPES`).

- chat.py, chat_schema.py: OpenAI chat completions
- completions.py: OpenAI text completions
- openai.py: what those two share, and `/v1/models`
- seam.py: `Ask` and `Answer`, what a dialect implements; exchange.py and delivery.py: the
  rest, shared
- anthropic.py: Anthropic Messages
- responses.py: OpenAI Responses
"""
