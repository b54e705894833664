"""An answer's text turned into content and tool calls (`CallDelta`s).

- `auto`: the model's own tool-call format, found from its chat template by mlx-lm
  (`<tool_call>...</tool_call>` and a dozen others): text between the markers is parsed
  with mlx-lm's parser for that format; text outside them is content. A call that does
  not parse stays content, so nothing the model wrote is lost.
- `named`: the whole answer is the arguments of one function (its schema enforced by the
  grammar), streamed as they come.
- `list`: the whole answer is a JSON list of `{"name", "arguments"}` (enforced by the
  grammar), each call streamed as it comes (`Listed`).

Two rules about the answer hold here, once for every dialect (each only translates):
a forced answer's text (`named`, `list`) is the calls' JSON and never content, so a list
cut short before its first call's name is whole is no call and no text (not the grammar's
`[{"name":"get`); and a request that allows no parallel calls gets its first call only
(the model may still write more in its own format: they are dropped, and the answer still
ends `tool_calls`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from steward.wire.protocol import CallDelta
from steward.worker.stops import overlap

FORCED = ("named", "list")  # the modes whose whole answer is a call (a grammar's)

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
        parallel: bool = True,
    ) -> None:
        self.mode = mode
        self.name = name
        self.parallel = parallel  # False: the first call only
        self.start, self.end = markers or ("", "")
        self.parser = parser
        self.tools = tools
        self.pending = ""
        self.inside = False  # between the start and end markers
        self.count = 0  # calls begun
        self.listed = Listed()

    @property
    def made(self) -> bool:
        """A call was begun (dropped ones included: the answer is still a call)."""
        return self.count > 0

    @property
    def forced(self) -> bool:
        """The whole answer is a call: its text is the call's JSON, never content."""
        return self.mode in FORCED

    def feed(self, text: str) -> Split:
        content, calls = self._found(text)
        return content, self._kept(calls)

    def finish(self) -> Split:
        """The answer ended: what is still held (a call whose format has no end marker)."""
        rest, self.pending = self.pending, ""  # none in a forced mode: no text is content
        if self.inside:
            self.inside = False
            content, calls = self._parsed(rest, "")
            return content, self._kept(calls)
        return rest, []

    def _kept(self, calls: list[CallDelta]) -> list[CallDelta]:
        """The calls the client gets: all, or the first alone."""
        return calls if self.parallel else [call for call in calls if call.index == 0]

    def _found(self, text: str) -> Split:
        if self.mode == "named":
            return "", self._named(text)
        if self.mode == "list":
            return "", self._begun(self.listed.feed(text))
        self.pending += text
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
        if not (found := _calls(parsed)):  # as content: nothing the model wrote is lost
            return self.start + body + end, []
        return "", [self._call(name, args) for name, args in found]

    def _begun(self, deltas: list[CallDelta]) -> list[CallDelta]:
        self.count += sum(delta.name is not None for delta in deltas)
        return deltas

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


class Listed:
    """The calls of a `list` answer, `[{"name": ..., "arguments": ...}, ...]`, as they come:
    a call's first delta once its name's string closes, then its arguments' text as it
    arrives (held until the name is known, should they come first). The grammar vouches
    for the JSON, so this scanner follows only strings and nesting: depth 1 is the list,
    2 a call, more the arguments' inside."""

    def __init__(self) -> None:
        self.depth = 0
        self.list = False  # the answer is a list (the grammar's), not some other value
        self.call = False  # inside a call's object, where its keys and name are
        self.string = False  # inside a string
        self.escaped = False
        self.role = ""  # what the characters read now are: "key", "name", "arguments", ""
        self.text = ""  # the key's or the name's text so far
        self.key = ""  # the call's key whose value comes next ("" before a key)
        self.index = -1  # the call being read
        self.name: str | None = None
        self.held = ""  # its arguments' text not yet sent

    def feed(self, text: str) -> list[CallDelta]:
        deltas: list[CallDelta] = []
        for char in text:
            if self.role == "arguments" and self._argument(char):
                continue
            self._structure(char, deltas)
        self._flush(deltas)
        return deltas

    def _flush(self, deltas: list[CallDelta]) -> None:
        if self.name is not None and self.held:
            deltas.append(CallDelta(self.index, None, self.held))
            self.held = ""

    def _in_string(self, char: str) -> bool:
        """One character inside a string; False: it was the closing quote."""
        self.string = self.escaped or char != '"'
        self.escaped = char == "\\" and not self.escaped
        return self.string

    def _argument(self, char: str) -> bool:
        """One character of the arguments' value; False: the value had ended before it."""
        if self.string:
            self._in_string(char)
        elif char == '"':
            self.string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]" and self.depth > 2:
            self.depth -= 1
            if self.depth == 2:  # the value is whole
                self.role = self.key = ""
        elif self.depth == 2 and (char in ",}" or char.isspace()):
            self.role = self.key = ""  # after a bare value: the call's own
            return char.isspace()
        self.held += char
        return True

    def _structure(self, char: str, deltas: list[CallDelta]) -> None:
        """A character outside the arguments: the list, a call, its keys and name."""
        if self.string:
            if self._in_string(char):
                self.text += char
                return
            try:
                read = json.loads(f'"{self.text}"')
            except ValueError:  # not JSON after all (the grammar says it is): as it stands
                read = self.text
            if self.role == "name":
                self.name = read
                deltas.append(CallDelta(self.index, read, self.held))
                self.held = ""
            self.key = read if self.role == "key" else ""
            self.role = ""
        elif self.depth == 2 and self.key == "arguments" and not char.isspace() and char != ":":
            self.role = "arguments"
            self._argument(char)
        elif char == '"':
            self.string, self.text = True, ""
            self.role = "value"  # a string outside a call's own keys and name
            if self.depth == 2 and self.call:
                self.role = "name" if self.key == "name" else "value" if self.key else "key"
        elif char in "{[":
            self.depth += 1
            if self.depth == 1:
                self.list = char == "["
            elif self.depth == 2 and self.list and char == "{":  # a call: none of the last
                self.index, self.name, self.key, self.held = self.index + 1, None, "", ""
                self.call = True
        elif char in "}]":
            self.depth -= 1
            if self.depth == 1 and self.call:  # the call is whole
                self._flush(deltas)
                self.call = False
        elif char == ",":
            self.key = ""
