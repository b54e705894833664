"""An answer's text turned into content and tool calls (`CallDelta`s).

- `auto`: the model's own tool-call format, found from its chat template by mlx-lm
  (`<tool_call>...</tool_call>` and a dozen others): text between the markers is parsed
  with mlx-lm's parser for that format; text outside them is content. A call that does
  not parse stays content, so nothing the model wrote is lost.
- `named`: the whole answer is the arguments of one function (its schema enforced by the
  grammar), streamed as they come.
- `list`: the whole answer is a JSON list of `{"name", "arguments"}` (enforced by the
  grammar), parsed when complete.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from steward.worker.protocol import CallDelta
from steward.worker.stops import overlap

Parser = Callable[[str, Any], Any]
Split = tuple[str, list[CallDelta]]


class ToolCalls:
    def __init__(
        self,
        mode: str,
        name: str = "",
        markers: tuple[str, str] | None = None,
        parser: Parser | None = None,
        tools: Any = None,
    ) -> None:
        self.mode = mode
        self.name = name
        self.start, self.end = markers or ("", "")
        self.parser = parser
        self.tools = tools
        self.pending = ""
        self.inside = False  # between the start and end markers
        self.count = 0  # calls begun

    @property
    def made(self) -> bool:
        return self.count > 0

    def feed(self, text: str) -> Split:
        if self.mode == "named":
            return "", self._named(text)
        self.pending += text
        if self.mode == "list":
            return "", []
        content, calls = "", []
        while self.pending:
            if self.inside:
                at = self.pending.find(self.end) if self.end else -1
                if at < 0:
                    break
                body, self.pending = self.pending[:at], self.pending[at + len(self.end) :]
                self.inside = False
                text, found = self._parsed(body, self.end)
                content, calls = content + text, calls + found
                continue
            at = self.pending.find(self.start)
            if at >= 0:
                content += self.pending[:at]
                self.pending = self.pending[at + len(self.start) :]
                self.inside = True
                continue
            cut = len(self.pending) - overlap(self.pending, self.start)
            content, self.pending = content + self.pending[:cut], self.pending[cut:]
            break
        return content, calls

    def finish(self) -> Split:
        """The answer ended: what is still held (a call whose format has no end marker)."""
        rest, self.pending = self.pending, ""
        if self.mode == "list":
            return self._listed(rest)
        if self.inside:
            self.inside = False
            return self._parsed(rest, "")
        return rest, []

    def _named(self, text: str) -> list[CallDelta]:
        if not text:
            return []
        first = self.count == 0
        self.count = 1
        return [CallDelta(0, self.name if first else None, text)]

    def _parsed(self, body: str, end: str) -> Split:
        """A call between the markers (`end`: the end marker, if one closed it)."""
        try:
            parsed = self.parser(body, self.tools) if self.parser else None
        except (ValueError, KeyError, TypeError, SyntaxError):
            parsed = None
        return self._split(_calls(parsed), self.start + body + end)

    def _listed(self, text: str) -> Split:
        try:
            found = _calls(json.loads(text))
        except ValueError:
            found = []
        return self._split(found, text)  # cut short (max_tokens): the text as it is

    def _split(self, found: list[tuple[str, Any]], text: str) -> Split:
        """The calls found, or, if none, `text` as content: nothing the model wrote is lost."""
        if not found:
            return text, []
        return "", [self._call(name, args) for name, args in found]

    def _call(self, name: str, arguments: Any) -> CallDelta:
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        self.count += 1
        return CallDelta(self.count - 1, name, arguments)


def _calls(parsed: Any) -> list[tuple[str, Any]]:
    """(name, arguments) of each call a parser found; none if anything is malformed."""
    items = parsed if isinstance(parsed, list) else [parsed]
    if parsed is None or not items:
        return []
    found = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return []
        found.append((item["name"], item.get("arguments", {})))
    return found
