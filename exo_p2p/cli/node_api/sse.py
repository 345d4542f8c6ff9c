"""Decoding an OpenAI chat-completion stream: server-sent events → ``data`` payloads →
text deltas, with each choice's finish reason and the usage counts handed to callbacks.

Pure: takes decoded lines, yields strings; ``NodeClient.chat_stream`` feeds it a response.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator

from exo_p2p.cli.errors import ApiError


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The ``data`` payload of each server-sent event in ``lines`` (decoded lines without
    their newline). Multi-line data is joined with ``\\n``; comments and other fields are
    ignored; a trailing event without its blank line is still yielded."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def chat_deltas(
    payloads: Iterable[str],
    on_finish: Callable[[str], None] | None = None,
    on_usage: Callable[[dict], None] | None = None,
) -> Iterator[str]:
    """Text deltas of an OpenAI chat-completion stream, given its SSE ``data`` payloads.

    Stops at ``[DONE]``. ``on_finish(reason)`` is called with each choice's
    ``finish_reason`` ("stop", "length", …) when a chunk carries one, ``on_usage(usage)``
    with a chunk's ``usage`` object (token counts). Raises ``ApiError`` (status 500) for a chunk carrying an
    ``error`` object (the node reports failures mid-stream that way) or for a payload that
    is not JSON.
    """
    for payload in payloads:
        if payload.strip() == "[DONE]":
            return
        try:
            chunk = json.loads(payload)
        except ValueError as e:
            raise ApiError(f"malformed stream chunk from the node: {payload[:80]!r}", 500) from e
        if not isinstance(chunk, dict):
            continue
        if isinstance(chunk.get("usage"), dict) and on_usage is not None:
            on_usage(chunk["usage"])
        err = chunk.get("error")
        if err:
            message = err.get("message") if isinstance(err, dict) else str(err)
            raise ApiError(str(message or "generation failed"), 500)
        for choice in chunk.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                yield content
            if choice.get("finish_reason") and on_finish is not None:
                on_finish(str(choice["finish_reason"]))

