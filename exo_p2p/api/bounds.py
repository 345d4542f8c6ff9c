"""The bounds of what one API request may carry into the cluster or cost its node, each named
with its unit and why (README "Security", docs/api.md "Bounds").

A generation request travels to the master as a ``SubmitTask`` command and, as its
``TaskCreated`` event, into the replicated log of every node: gossiped, persisted, served to
every follower that catches up, and held in State until the task ends. So every request
field that reaches them is bounded in count and bytes (a 400 naming the field beyond it), and
so is the encoded command as a whole (``check_command_size``), well below what the network
carries at all: one gossip message at most ``GossipParams.max_payload_bytes`` (512 KiB), one
request frame (a command, a log response) at most ``NetConfig.max_frame_bytes`` (64 MiB).
The prompt and the messages have no bound of their own: the command's bound is theirs.

Endpoints that do heavy work outside the log get a concurrency bound (429 beyond it) and a
size bound (413 beyond it): ``count_tokens`` runs the model's tokenizer in a thread.

Pure; every check raises ``ApiError`` (400/413), which the app answers in the route's family
error shape. The concurrency of ``count_tokens`` is counted by ``exo_p2p.api.context``.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from exo_p2p.api.errors import ApiError
from exo_p2p.api.views import parse_nodes
from exo_p2p.types import Command, GenerationParams

MAX_STOP_STRINGS = 16
"""Stop strings of one request at most (count, before duplicates and empty ones are dropped):
OpenAI allows 4; clients of the other families send a handful."""
MAX_STOP_BYTES = 256
"""UTF-8 bytes of one stop string at most: stop strings are words and markers such as
``</answer>``; the runner matches each against the new text of every token."""
MAX_LOGIT_BIAS_ENTRIES = 1024
"""Token ids in one ``logit_bias`` at most (count): enough to ban or favour every variant of
a few hundred words; each entry costs ~15 bytes in the command."""
MAX_TOKEN_ID_DIGITS = 20
"""Characters of a ``logit_bias`` key at most, checked before it is read as an integer (a
token id has at most 10 digits; Python refuses to read more than 4300 digits at all)."""
MAX_NODE_NAMES = 256
"""Node names in one ``nodes`` filter (placement, previews) at most (count)."""
MAX_NODE_NAME_CHARS = 256
"""Characters of one node name at most: node ids are 52 characters, friendly names are host
names (at most 253)."""
MAX_COMMAND_BYTES = 128 * 1024
"""Encoded bytes (msgpack, as the wire carries it) of one command the API sends at most:
prompt, messages, stop strings and logit bias of a generation together (~32,000 tokens of
English text). Its ``TaskCreated`` event is a few hundred bytes larger at most, so it is about
a quarter of one gossip message and 1/512 of one request frame, and 64 requests in flight per
node (the default ``--queue-limit``) hold at most 8 MiB of State on every node. A request
that moves to another instance after a failure carries the tokens already sent besides (at
most 5 bytes each). Beyond it: a 400, code ``request_too_large``."""
COUNT_TOKENS_CONCURRENCY = 2
"""``count_tokens`` requests one node's API tokenizes at once at most (count; a 429 beyond
it): each holds its text, tokens and the tokenizer's work memory in a thread."""
MAX_COUNT_TOKENS_TEXT_BYTES = 1024 * 1024
"""UTF-8 bytes of the text one ``count_tokens`` request may tokenize at most (system and
messages together; a 413 beyond it): eight times what a generation may carry, so any prompt
a client may still send is countable, and a few requests in flight take tens of MiB, not GiB."""

_encode = msgspec.msgpack.Encoder().encode


def check_stop(items: Iterable[str], param: str) -> tuple[str, ...]:
    """The stop strings of ``items`` without empty ones and duplicates, order kept.

    Raises ``ApiError(400, param=param)`` for more than ``MAX_STOP_STRINGS`` strings, or one
    longer than ``MAX_STOP_BYTES`` UTF-8 bytes (param ``param[i]``)."""
    listed = list(items)
    if len(listed) > MAX_STOP_STRINGS:
        raise ApiError(400, f"{param} has {len(listed)} stop strings; at most {MAX_STOP_STRINGS} are accepted", param=param)
    for i, s in enumerate(listed):
        size = len(s.encode("utf-8", "surrogatepass"))
        if size > MAX_STOP_BYTES:
            raise ApiError(400, f"{param}[{i}] is {size} bytes long; a stop string may have at most {MAX_STOP_BYTES} bytes (UTF-8)",
                           param=f"{param}[{i}]")
    return tuple(s for s in dict.fromkeys(listed) if s)


def check_command_size(command: Command) -> int:
    """The encoded bytes of ``command``; raises ``ApiError(400, code="request_too_large")``
    when they exceed ``MAX_COMMAND_BYTES`` (the message says how much and why)."""
    size = len(_encode(command))
    if size > MAX_COMMAND_BYTES:
        raise ApiError(400, f"the request is {size} bytes as a command to the cluster, above the limit of {MAX_COMMAND_BYTES} bytes "
                       f"(prompt, messages and stop strings together): every request is replicated into every node's log; "
                       f"send a shorter prompt", code="request_too_large")
    return size


def prompt_text_bytes(params: GenerationParams) -> int:
    """UTF-8 bytes of the text of ``params`` (the raw prompt, or every message's content)."""
    texts = [params.prompt] if params.prompt is not None else [m.content for m in params.messages]
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)


def check_count_tokens_size(params: GenerationParams) -> None:
    """Raises ``ApiError(413, code="request_too_large")`` when the text to count exceeds
    ``MAX_COUNT_TOKENS_TEXT_BYTES`` bytes."""
    size = prompt_text_bytes(params)
    if size > MAX_COUNT_TOKENS_TEXT_BYTES:
        raise ApiError(413, f"the text to count is {size} bytes, above the limit of {MAX_COUNT_TOKENS_TEXT_BYTES} bytes",
                       param="messages", code="request_too_large")


def node_filter(value: str | Iterable[str] | None, param: str = "nodes") -> tuple[str, ...]:
    """The node names of a ``nodes`` filter (``"a,b"`` or ``["a", "b,c"]``, as ``parse_nodes``);
    None (no filter given) is ``()``, any node.

    Raises ``ApiError(400, param=param)`` for a filter that names no node (empty, blank or
    only commas: it would read as no filter and place anywhere), more than
    ``MAX_NODE_NAMES`` names, or a name longer than ``MAX_NODE_NAME_CHARS``."""
    if value is None:
        return ()
    names = parse_nodes(value)
    if not names:
        raise ApiError(400, f"{param} names no node (it is empty or only commas): name at least one node, or leave {param} out "
                       f"for any node", param=param)
    if len(names) > MAX_NODE_NAMES:
        raise ApiError(400, f"{param} names {len(names)} nodes; at most {MAX_NODE_NAMES} are accepted", param=param)
    if (long := next((n for n in names if len(n) > MAX_NODE_NAME_CHARS), None)) is not None:
        raise ApiError(400, f"{param} has a name of {len(long)} characters ({long[:40]!r}…); a node name has at most "
                       f"{MAX_NODE_NAME_CHARS}", param=param)
    return names
