"""``include`` and reasoning carried across turns in OpenAI Responses (docs/api.md#reasoning-across-turns).

``include`` values are honoured or refused one by one (``INCLUDE``): ``reasoning.encrypted_content``
adds each reasoning item's sealed text (``exo_p2p.api.families.openai.sealed_reasoning``); the values about
built-in tools' outputs and input images are honoured trivially (those tools are never run
here and input items are never echoed, so no such output exists); ``message.output_text.logprobs``
adds each output text's ``logprobs`` (``top_logprobs`` alternatives, ``wants_logprobs``); any
value the API does not define is refused.

A later turn's ``reasoning`` input item with ``encrypted_content`` is opened (400 naming
``input[i].encrypted_content`` when it does not open) and its text rendered as the
reasoning of the assistant turn that follows it (its message or calls); one without
``encrypted_content`` is accepted and not rendered, as before.
"""

from __future__ import annotations

from typing import Any

import msgspec

from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.common import refuse
from exo_p2p.api.families.openai.sealed_reasoning import SealError, unseal
from exo_p2p.types import ChatMessage

ENCRYPTED_REASONING = "reasoning.encrypted_content"
OUTPUT_LOGPROBS = "message.output_text.logprobs"
_NEVER_RUN = "honoured: this server runs no built-in tools, so no such output exists"
INCLUDE: dict[str, str | None] = {
    ENCRYPTED_REASONING: None,
    OUTPUT_LOGPROBS: None,
    "web_search_call.results": _NEVER_RUN,
    "web_search_call.action.sources": _NEVER_RUN,
    "file_search_call.results": _NEVER_RUN,
    "code_interpreter_call.outputs": _NEVER_RUN,
    "computer_call_output.output.image_url": _NEVER_RUN,
    "message.input_image.image_url": "honoured: input items are never echoed, so no image URL is",
}
"""Each ``include`` value the Responses API defines: None or "honoured: …" when it is
honoured, else why it is refused."""
MAX_INCLUDE = len(INCLUDE)


def wants_encrypted_reasoning(include: list[str] | None) -> bool:
    """Whether ``include`` asks for ``reasoning.encrypted_content``; 400 naming ``include``
    for a value refused (with the reason) or unknown, or more values than exist."""
    if not include:
        return False
    if len(include) > MAX_INCLUDE * 2:
        raise ApiError(400, f"include has {len(include)} values; the API defines {MAX_INCLUDE}", param="include")
    for value in include:
        reason = INCLUDE.get(value, "unknown value") if isinstance(value, str) else "values are strings"
        if reason is not None and not reason.startswith("honoured"):
            raise refuse("include", f"{str(value)[:64]!r}: {reason}")
    return ENCRYPTED_REASONING in include


def wants_logprobs(include: list[str] | None) -> bool:
    """Whether ``include`` asks for the output text's log-probabilities (checked by
    ``wants_encrypted_reasoning`` first)."""
    return bool(include) and OUTPUT_LOGPROBS in include  # type: ignore[operator]


def reasoning_message(i: int, item: Any, key: bytes) -> ChatMessage | None:
    """A ``reasoning`` input item as an assistant message holding only its reasoning (joined
    to the next assistant turn by ``join_reasoning``), or None without ``encrypted_content``."""
    sealed = getattr(item, "encrypted_content", None)
    if sealed is None:
        return None
    if not isinstance(sealed, str):
        raise ApiError(400, f"input[{i}].encrypted_content must be a string", param=f"input[{i}].encrypted_content")
    try:
        return ChatMessage("assistant", "", reasoning=unseal(key, sealed))
    except SealError as exc:
        raise ApiError(400, f"input[{i}].encrypted_content {exc}", param=f"input[{i}].encrypted_content",
                       code="invalid_encrypted_content") from None


def _reasoning_only(m: ChatMessage) -> bool:
    return m.role == "assistant" and not m.content and not m.tool_calls and m.reasoning is not None


def join_reasoning(messages: list[ChatMessage]) -> list[ChatMessage]:
    """``messages`` with each run of reasoning-only assistant messages joined to the assistant
    message right after it (reasoning texts in order); a run with no assistant message after
    it stays one assistant turn of that reasoning alone (an answer cut short while it
    reasoned), so the conversation renders as it was generated."""
    out: list[ChatMessage] = []
    pending: list[str] = []
    for m in messages:
        if _reasoning_only(m):
            pending.append(m.reasoning or "")
            continue
        if pending and m.role == "assistant":
            m = msgspec.structs.replace(m, reasoning="".join([*pending, m.reasoning or ""]))
        elif pending:
            out.append(ChatMessage("assistant", "", reasoning="".join(pending)))
        pending = []
        out.append(m)
    if pending:
        out.append(ChatMessage("assistant", "", reasoning="".join(pending)))
    return out
