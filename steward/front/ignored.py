"""What a request carried that steward does not know: ignored, never refused (SPEC §8).

Agents' CLIs send fields and tool types newer than any SDK types (beta fields, client
metadata, new server tools), and a new CLI comes out every few days: a server that refused
the newest field would break the agent at every release, and the local servers agents run
on (llama.cpp's, Ollama, LM Studio) ignore what they do not know. So an unknown field is
left out of everything after validation (the validated body, the template, the store, the
worker), named in the `steward-ignored` response header (`tools.10.defer_loading,
client_metadata`) on the answer, streamed or not, and on an error, and logged at warning
level once per route and field. A tool steward cannot serve (one without a schema: a server
tool) is left out and named the same way (each dialect's schema says which). With
`--strict-requests` both are refused instead, a 400 naming the path, for people who write
clients.

How: every schema model allows extras and hands them here as it validates (`unknown`, from
the dialects' `Schema`), with the raw JSON object they came from; a dialect leaves a tool out
with `left_out`, naming the raw list that held it; a body that fails validation has its own
top-level keys checked against its model by the route (`unknown_at_top`). The paths are
found once, at the end (`finish`), by one walk of the body for those objects, so a path is
exact whatever union the model was validated through. The notes live in a context variable
that the route sets around validation (body.py): a model validated outside a request (the
store, tests) notes nothing.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails

HEADER = "steward-ignored"
MAX_HEADER = 2048  # characters: Node's HTTP clients refuse responses with 16 KiB of headers
MAX_LOGGED = 1024  # distinct fields logged per process; a client inventing names stops here
PLAIN_KEY = re.compile(r"[A-Za-z0-9_$@:/+-]{1,64}")  # written as is; others JSON-quoted
INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")

log = logging.getLogger("steward.front")
_current: ContextVar[Reading | None] = ContextVar("steward_ignored", default=None)
_logged: set[tuple[str, str]] = set()

Key = str | int


@dataclass
class Reading:
    """One request body's notes: (raw container, key) pairs, each container kept alive so
    that its id stays its own until the paths are found."""

    strict: bool
    notes: dict[tuple[int, Key], Any] = field(default_factory=dict)

    def paths(self, body: Any) -> list[str]:
        """Each note's path in `body`, in the body's order."""
        by_container: dict[int, list[Key]] = {}
        for cid, key in self.notes:
            by_container.setdefault(cid, []).append(key)
        found: list[str] = []
        stack: list[tuple[Any, str]] = [(body, "")]
        while stack:
            value, path = stack.pop()
            found += [join(path, key) for key in by_container.pop(id(value), [])]
            pairs = value.items() if isinstance(value, dict) else enumerate(value)
            stack += [
                (child, join(path, key))
                for key, child in reversed(list(pairs))
                if isinstance(child, dict | list)
            ]
        return found + [join("", key) for keys in by_container.values() for key in keys]


@contextmanager
def reading(strict: bool) -> Iterator[Reading]:
    """Notes for the body validated within (`--strict-requests`: refused instead)."""
    current = Reading(strict)
    token = _current.set(current)
    try:
        yield current
    finally:
        _current.reset(token)


def unknown(model: BaseModel, raw: Any) -> None:
    """`model`'s unknown fields, just validated from `raw`: dropped from it, and noted, or
    with `--strict-requests` refused as pydantic's own `extra_forbidden` (the 400 names
    the path)."""
    extra = model.__pydantic_extra__
    if not extra:
        return
    names = list(extra)
    extra.clear()
    current = _current.get()
    if current is None:
        return
    for name in names:
        current.notes.setdefault((id(raw), name), raw)
    if current.strict:
        errors = [InitErrorDetails(type="extra_forbidden", loc=(n,), input=raw[n]) for n in names]
        raise ValidationError.from_exception_data(type(model).__name__, errors)


def unknown_at_top(current: Reading, kind: type[BaseModel], body: Any) -> None:
    """The body's own keys that its model (`kind`) does not know, where validating it
    failed (its model's validator noted none): named too, since a 400 for another reason
    still says what was not known. The models inside that validated noted their own."""
    if not isinstance(body, dict):
        return
    known = {f.alias or name for name, f in kind.model_fields.items()} | set(kind.model_fields)
    for name in body:
        if name not in known:
            current.notes.setdefault((id(body), name), body)


def left_out(container: list[Any], index: int) -> bool:
    """A tool steward cannot serve, at `container[index]`, left out and noted; True where
    `--strict-requests` refuses it instead."""
    current = _current.get()
    if current is None:
        return False
    current.notes.setdefault((id(container), index), container)
    return current.strict


def tool_kind(tool: dict[str, Any]) -> str:
    return str(tool.get("type"))[:64]


def served_tools(tools: Any, servable: Callable[[dict[str, Any]], bool], why: str) -> Any:
    """`tools` (raw, before validation) less those steward cannot serve (not `servable`:
    a server tool, a tool with no schema), each left out and noted; with
    `--strict-requests` the first is a 400 (`why`, after its index and type)."""
    if not isinstance(tools, list):
        return tools  # validation says what is wrong
    kept = []
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and not servable(tool):
            if left_out(tools, i):
                raise ValueError(f"tools.{i}: the {tool_kind(tool)!r} tool {why}")
            continue
        kept.append(tool)
    return kept


def finish(current: Reading, body: Any, route: str, agent: str) -> str | None:
    """The `steward-ignored` header's value for what `current` noted in `body` (None:
    nothing), each field logged the first time this process meets it on `route`."""
    paths = current.paths(body) if current.notes else []
    for path in paths:
        _log_once(route, path, agent, body)
    return header(paths) if paths else None


def header(paths: list[str]) -> str:
    """The paths, comma-separated, bounded (the rest counted: `+12 more`)."""
    shown: list[str] = []
    size = 0
    for path in paths:
        size += len(path) + 2
        if size > MAX_HEADER:
            break
        shown.append(path)
    rest = len(paths) - len(shown)
    return ", ".join(shown + ([f"+{rest} more"] if rest else []))


def join(path: str, key: Key) -> str:
    """A field's path as the header names it: a plain key as is, any other JSON-quoted with
    its commas escaped too (JSON's u002c), so the header's `, ` only ever separates names."""
    if isinstance(key, int) or PLAIN_KEY.fullmatch(key):
        name = str(key)
    else:
        name = json.dumps(key[:64]).replace(",", "\\u002c")
    return f"{path}.{name}" if path else name


def _log_once(route: str, path: str, agent: str, body: Any) -> None:
    name = INDEX.sub("*", path)  # tools.3.x and tools.4.x are one field
    if name.endswith("*") and isinstance(tool := _at(body, path), dict):
        name += f" (a {tool_kind(tool)!r} tool)"  # a tool left out: each type once
    if (route, name) in _logged or len(_logged) > MAX_LOGGED:
        return
    _logged.add((route, name))
    if len(_logged) > MAX_LOGGED:
        log.warning("ignored fields: %d logged; further ones are not", MAX_LOGGED)
        return
    log.warning(
        "ignored %s on %s (a field or tool steward does not serve; sent by %s); "
        "logged once, named in every answer's %s header",
        name,
        route,
        agent or "an unnamed client",
        HEADER,
    )


def _at(body: Any, path: str) -> Any:
    """The value at a path of plain keys and indices (None where it leads nowhere)."""
    value = body
    for key in path.split("."):
        if isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            return None
    return value
