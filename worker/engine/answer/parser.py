"""Following a row's decoded text: content, reasoning and tool calls.

A model that thinks writes its reasoning between think markers (``<think>`` … ``</think>``);
a model with a native tool format writes each call between call markers (``<tool_call>`` …
``</tool_call>``) in its family's syntax. ``OutputParser`` follows the decoded text with a
small state machine — content, reasoning, call — and turns it into ``Piece`` events: text of
a channel (``content`` or ``reasoning``), or a parsed ``ParsedCall``. Markers may be split
across tokens: text that could be the start of a marker is held back until the next text
tells (at most the longest marker's length). Nothing of a call reaches the content: a call
that its family's parser refuses comes back as content text (markers included) with
``Piece.warning`` set, never dropped.

Why in the runner: the runner has the model's tokenizer and mlx-lm's family parsers (the
markers and ``parse_tool_call`` of ``TokenizerWrapper``); a request that moves replays its
tokens into a fresh parser (as into its detokenizer and grammar), so it continues in the same
state, and the API node stays model-agnostic (docs/architecture.md#engine).

Pure: no MLX, no I/O; the parse function is injected.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from worker.engine.answer.stop import longest_suffix_prefix

Channel = Literal["content", "reasoning"]


@dataclass(frozen=True)
class Markers:
    """The marker strings of a model (None: the model has no such block)."""

    think_start: str | None = None
    think_end: str | None = None
    call_start: str | None = None
    call_end: str | None = None


@dataclass(frozen=True)
class ParsedCall:
    """One tool call: ``name`` and ``arguments`` (JSON text of an object)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Piece:
    """One event: ``text`` of ``channel``, or a ``call``; ``warning`` says why a call's text
    came back as content."""

    channel: Channel = "content"
    text: str = ""
    call: ParsedCall | None = None
    warning: str | None = None


def calls_of(parsed: Any) -> list[ParsedCall]:
    """A family parser's result (a dict ``{"name", "arguments"}`` or a list of them;
    ``arguments`` a dict or its JSON text) as ``ParsedCall``s. Raises ``ValueError`` for any
    other shape."""
    items = parsed if isinstance(parsed, list) else [parsed]
    out: list[ParsedCall] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ValueError(f"a tool call needs a name, got {str(item)[:80]!r}")
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        if not isinstance(args, dict):
            raise ValueError(f"tool call arguments must be an object, got {type(args).__name__}")
        out.append(ParsedCall(item["name"], json.dumps(args, ensure_ascii=False)))
    return out


class OutputParser:
    """The state machine (see the module docstring). ``thinking``: the row starts inside a
    think block (its prompt ends inside one); ``parse``: the family's call parser (text
    between the call markers → a dict or list of dicts), None when the model has no native
    tool format. ``feed`` the decoded text as it comes, ``finish`` at the end."""

    def __init__(self, markers: Markers, *, thinking: bool = False,
                 parse: Callable[[str], Any] | None = None) -> None:
        self.markers = markers
        self.parse = parse
        self.state: Literal["content", "reasoning", "call"] = "reasoning" if thinking else "content"
        self._held = ""
        self._call = ""

    def _watch(self) -> list[tuple[str, str]]:
        """(marker, next state) pairs that end or start a block in the current state."""
        m = self.markers
        if self.state == "reasoning":
            return [(m.think_end, "content")] if m.think_end else []
        if self.state == "call":
            return [(m.call_end, "content")] if m.call_end else []
        out = []
        if m.think_start and m.think_end:
            out.append((m.think_start, "reasoning"))
        if m.call_start and m.call_end and self.parse is not None:
            out.append((m.call_start, "call"))
        return out

    def feed(self, text: str) -> list[Piece]:
        """The events ``text`` (the next decoded text) completes."""
        self._held += text
        out: list[Piece] = []
        while True:
            watch = self._watch()
            hits = [(self._held.find(marker), marker, state) for marker, state in watch if marker in self._held]
            if not hits:
                keep = longest_suffix_prefix(self._held, [marker for marker, _ in watch])
                out += self._emit(self._held[: len(self._held) - keep])
                self._held = self._held[len(self._held) - keep :]
                return out
            at, marker, state = min(hits)
            out += self._emit(self._held[:at])
            self._held = self._held[at + len(marker) :]
            out += self._switch(state)

    def finish(self) -> list[Piece]:
        """The events of the text held at the end: held text in its channel; an unfinished
        call as content text with a warning."""
        out = self._emit(self._held)
        self._held = ""
        if self.state == "call":
            raw = (self.markers.call_start or "") + self._call
            self._call, self.state = "", "content"
            out.append(Piece("content", raw, warning="the output ended inside a tool call"))
        return [p for p in out if p.text or p.call]

    def _emit(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self.state == "call":
            self._call += text
            return []
        return [Piece(self.state, text)]  # type: ignore[arg-type]

    def _switch(self, state: str) -> list[Piece]:
        out: list[Piece] = []
        if self.state == "call":
            out = self._parse_call()
        self.state = state  # type: ignore[assignment]
        return out

    def _parse_call(self) -> list[Piece]:
        raw, self._call = self._call, ""
        assert self.parse is not None
        try:
            return [Piece(call=c) for c in calls_of(self.parse(raw))]
        except Exception as e:  # noqa: BLE001 - any parser failure: the text comes back
            text = f"{self.markers.call_start}{raw}{self.markers.call_end}"
            return [Piece("content", text, warning=f"a tool call did not parse: {type(e).__name__}: {e}"[:300])]
