"""The benchmarks' HTTP side: a pooled async client, and one streamed chat completion as a
client sees it."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

# Without it, Nagle plus the server's delayed ACK can add 40 ms to a request on Linux.
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def pooled(url: str, clients: int) -> httpx.AsyncClient:
    """One keep-alive connection per client."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=NODELAY)
    return httpx.AsyncClient(base_url=url, transport=transport, timeout=600)


@dataclass
class Streamed:
    started: float
    times: list[float] = field(default_factory=list)  # each content chunk's arrival
    text: list[str] = field(default_factory=list)
    finish: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # steward's own clock; None from other servers


async def stream_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> Streamed | str:
    """One streamed chat completion, or what went wrong (an HTTP status, an error event,
    a transport error)."""
    seen = Streamed(time.perf_counter())
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return f"stream: {chunk['error'].get('type', chunk['error'])}"
                for choice in chunk.get("choices", []):
                    if content := choice.get("delta", {}).get("content"):
                        seen.times.append(time.perf_counter())
                        seen.text.append(content)
                    seen.finish = choice.get("finish_reason") or seen.finish
                seen.usage = chunk.get("usage") or seen.usage
                seen.timings = chunk.get("timings") or seen.timings
    except httpx.HTTPError as exc:
        return type(exc).__name__
    return seen
