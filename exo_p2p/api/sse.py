"""Encoding of chat completions: server-sent events for streams, one JSON body otherwise.

Pure: ``CompletionFormat`` turns our chunks' facts into OpenAI bytes. A stream is
``role chunk, content chunks…, one finish chunk, [usage chunk], data: [DONE]``; exactly one
event carries a non-null ``finish_reason``; keys the OpenAI schema forbids as ``null``
(``tool_calls``, ``function_call``, ``name``, ``logprobs``, ``refusal``) never appear.
"""

from __future__ import annotations

import msgspec

from exo_p2p.api.errors import error_body
from exo_p2p.api.schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    Delta,
    StreamChoice,
    Usage,
)
from exo_p2p.types import ErrorInfo

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
SSE_MEDIA_TYPE = "text/event-stream"

_json = msgspec.json.Encoder()


def openai_finish_reason(reason: str) -> str:
    """Our ``FinishReason`` as OpenAI's: ``cancelled`` → ``stop``; ``stop``/``length`` unchanged."""
    return "stop" if reason == "cancelled" else reason


def sse_event(payload: bytes) -> bytes:
    """One SSE event carrying ``payload`` (a JSON document on one line)."""
    return b"data: " + payload + b"\n\n"


def sse_error(info: ErrorInfo) -> bytes:
    """The SSE event of an error that happened after the stream began."""
    return sse_event(error_body(info))


class CompletionFormat(msgspec.Struct, frozen=True):
    """Bytes of one completion's events and body: ``id`` is ``chatcmpl-<task_id>``, ``created``
    Unix seconds, ``model`` the model id served."""

    id: str
    created: int
    model: str

    def _chunk(self, delta: Delta, finish_reason: str | None) -> bytes:
        choice = StreamChoice(index=0, delta=delta, finish_reason=finish_reason)
        return sse_event(_json.encode(ChatCompletionChunk(self.id, "chat.completion.chunk", self.created, self.model, [choice])))

    def role_event(self) -> bytes:
        """The first event: ``delta: {"role": "assistant", "content": ""}``."""
        return self._chunk(Delta(role="assistant", content=""), None)

    def content_event(self, text: str) -> bytes:
        return self._chunk(Delta(content=text), None)

    def finish_event(self, reason: str) -> bytes:
        """The one event with a non-null ``finish_reason`` (empty delta)."""
        return self._chunk(Delta(), openai_finish_reason(reason))

    def usage_event(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The ``stream_options.include_usage`` event: ``choices: []`` and the usage."""
        usage = Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)
        chunk = ChatCompletionChunk(self.id, "chat.completion.chunk", self.created, self.model, [], usage)
        return sse_event(_json.encode(chunk))

    def completion_body(self, text: str, reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """A whole non-streamed ``chat.completion`` JSON body."""
        choice = Choice(index=0, message=AssistantMessage("assistant", text), finish_reason=openai_finish_reason(reason))
        usage = Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)
        return _json.encode(ChatCompletion(self.id, "chat.completion", self.created, self.model, [choice], usage))
