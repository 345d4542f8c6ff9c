"""System messages in the middle of a conversation, for chat templates that cannot show them.

Agents send system turns after the first message (Claude Code puts its ``# Environment``
block at ``messages[1]`` for models it does not know; OpenAI clients send ``developer``
turns anywhere). Most templates render a ``system`` message wherever it stands; some raise
("roles must alternate") and some silently drop every system message but the first. The rule
(docs/api.md#system-messages-anywhere):

1. When the template renders every late system message (its text, stripped, appears in the
   rendered prompt), the messages are used as they are.
2. Otherwise each late system message is folded into a user turn: prefixed to the next user
   message (``"<system>\\n\\n<user>"``); with no user message after it, appended to the last
   user message before it; with no user message at all, appended to the leading system
   prompt (or made the leading system prompt).

A system message is *late* when a message of another role comes before it. The choice
depends only on the template and the messages, and folding changes nothing before the
folded turn's user message, so a conversation that grows by whole turns renders the same
bytes for its earlier turns every time (the prompt cache keeps hitting). Pure; messages are
the chat-template dicts (``{"role", "content", …}``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Message = dict[str, Any]
FOLD_SEPARATOR = "\n\n"
"""Between a folded system text and the user text it joins."""


def late_system_indexes(messages: Sequence[Message]) -> list[int]:
    """Indexes of the system messages that follow a message of another role."""
    out: list[int] = []
    seen_other = False
    for i, m in enumerate(messages):
        if m.get("role") != "system":
            seen_other = True
        elif seen_other:
            out.append(i)
    return out


def _text(m: Message) -> str:
    content = m.get("content")
    return content if isinstance(content, str) else ""


def fold_late_system(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with every late system message folded into a user turn (rule 2 of the
    module docstring); the other messages are copied unchanged, in order."""
    late = set(late_system_indexes(messages))
    if not late:
        return [dict(m) for m in messages]
    out: list[Message] = []
    pending: list[str] = []
    for i, m in enumerate(messages):
        if i in late:
            pending.append(_text(m))
            continue
        item = dict(m)
        if pending and item.get("role") == "user":
            item["content"] = FOLD_SEPARATOR.join([*pending, _text(item)])
            pending = []
        out.append(item)
    if pending:
        _fold_tail(out, pending)
    return out


def _fold_tail(out: list[Message], pending: list[str]) -> None:
    """Late system texts with no user message after them: onto the last user message, else
    the leading system prompt."""
    for item in reversed(out):
        if item.get("role") == "user":
            item["content"] = FOLD_SEPARATOR.join([_text(item), *pending])
            return
    if out and out[0].get("role") == "system":
        out[0]["content"] = FOLD_SEPARATOR.join([_text(out[0]), *pending])
    else:
        out.insert(0, {"role": "system", "content": FOLD_SEPARATOR.join(pending)})


def template_shows_late_system(render_text: Callable[[list[Message]], str], messages: Sequence[Message]) -> bool:
    """Whether ``render_text`` (the chat template rendering ``messages`` to text) shows every
    late system message's text; False when it raises (any exception: a template's own)."""
    try:
        text = render_text(list(messages))
    except Exception:  # noqa: BLE001 - a template refusing the order is the case this handles
        return False
    return all(_text(messages[i]).strip() in text for i in late_system_indexes(messages))


def messages_for_template(render_text: Callable[[list[Message]], str], messages: Sequence[Message]) -> list[Message]:
    """``messages`` as the template should get them: unchanged when there is no late system
    message or the template shows them (rule 1), else folded (rule 2)."""
    if not late_system_indexes(messages) or template_shows_late_system(render_text, messages):
        return list(messages)
    return fold_late_system(messages)
