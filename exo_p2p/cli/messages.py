"""Messages a user can act on: the missing or refused API key, nodes named by their names,
and the one line of figures after a streamed answer. Pure functions (no I/O)."""

from __future__ import annotations

import re
from dataclasses import dataclass

API_KEY_ENV = "EXO_P2P_API_KEY"
"""The API key the CLI sends (``Authorization: Bearer``) to a node started with ``--api-key``."""

NODE_ID_PATTERN = re.compile(r"\b(?:12D3KooW|Qm)[1-9A-HJ-NP-Za-km-z]{40,50}\b")
"""A whole libp2p node id (base58: ``12D3KooW…`` for Ed25519 keys, ``Qm…`` for RSA)."""


def api_key_message(url: str, source: str | None) -> str:
    """The error for a 401 from the node at ``url``: no key was sent (``source`` None), or
    the key from ``source`` (``"--api-key"`` or ``"$EXO_P2P_API_KEY"``) was refused. Both
    name the option and the environment variable that give the key."""
    if source is None:
        return (f"the node at {url} requires an API key: pass --api-key KEY "
                f"or set {API_KEY_ENV}=KEY (the key the node was started with)")
    return (f"the node at {url} refused the API key from {source}: pass the key the node was "
            f"started with as --api-key KEY or {API_KEY_ENV}=KEY")


def check_api_key(key: str, source: str) -> str:
    """``key`` without surrounding blanks. Raises ``ValueError`` naming ``source`` when it
    is empty or holds a character an HTTP header cannot carry (non-ASCII, control)."""
    key = key.strip()
    if not key:
        raise ValueError(f"{source} is empty")
    if not key.isascii() or not key.isprintable():
        raise ValueError(f"{source} holds a character an HTTP header cannot carry (only printable ASCII)")
    return key


def name_node_ids(text: str, names: dict[str, str]) -> str:
    """``text`` with every whole node id that ``names`` (node id → friendly name) knows
    replaced by its name; a name two nodes share keeps an id prefix ("mac (12D3KooWAbcd…)").
    Ids of nodes not in ``names`` (gone from the cluster) stay as they are."""
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1

    def named(match: re.Match[str]) -> str:
        node_id = match.group(0)
        name = names.get(node_id)
        if not name:
            return node_id
        return name if counts[name] == 1 else f"{name} ({node_id[:12]}…)"

    return NODE_ID_PATTERN.sub(named, text)


def has_node_ids(text: str) -> bool:
    """Whether ``text`` names a node by its whole id."""
    return NODE_ID_PATTERN.search(text) is not None


@dataclass
class AnswerStats:
    """Timings of one streamed answer, seconds on the monotonic clock: ``started`` when the
    request was sent, ``first`` / ``last`` at the first / last text delta (None: none came);
    ``deltas`` text deltas seen; ``completion_tokens`` from the node's usage (None: not
    sent); ``finish_reason`` as the node gave it (None: the stream ended without one)."""

    started: float
    first: float | None = None
    last: float | None = None
    deltas: int = 0
    completion_tokens: int | None = None
    finish_reason: str | None = None

    def delta(self, now: float) -> None:
        """Count one text delta that arrived at ``now``."""
        if self.first is None:
            self.first = now
        self.last = now
        self.deltas += 1


FINISH_TEXT = {"stop": "stop (the answer ended)", "length": "length (the token limit)"}


def stats_line(stats: AnswerStats) -> str:
    """One line of figures after an answer, e.g. ``"TTFT 0.42 s · 120 tokens at 35.1
    tokens/s · finish reason: stop (the answer ended)"``. TTFT is the time to the first text
    delta; the rate counts the tokens after the first over the time after it (no rate with
    fewer than two tokens); the token count is the node's usage, else the deltas seen."""
    parts = []
    if stats.first is not None:
        parts.append(f"TTFT {stats.first - stats.started:.2f} s")
    tokens = stats.completion_tokens if stats.completion_tokens is not None else stats.deltas
    span = (stats.last or 0.0) - (stats.first or 0.0)
    count = f"{tokens} token{'' if tokens == 1 else 's'}"
    if tokens >= 2 and stats.first is not None and span > 0:
        parts.append(f"{count} at {(tokens - 1) / span:.1f} tokens/s")
    else:
        parts.append(count)
    reason = stats.finish_reason
    parts.append(f"finish reason: {FINISH_TEXT.get(reason, reason) if reason else 'none (the stream ended without one)'}")
    return " · ".join(parts)


def named_reasons(instances: list[dict], names: dict[str, str]) -> list[dict]:
    """``instances`` (``GET /instances`` items) with the node ids in each failure
    ``reason`` replaced by node names (``name_node_ids``), for the table; changed items are
    copies, the input is unchanged."""
    out = []
    for inst in instances:
        if isinstance(inst.get("reason"), str) and has_node_ids(inst["reason"]):
            inst = {**inst, "reason": name_node_ids(inst["reason"], names)}
        out.append(inst)
    return out


def unknown_model_message(model: str, known: list[str]) -> str:
    """The CLI's one wording of a model name the cluster does not know (the API's own, and
    ``stop`` of a misspelt name): ``unknown model NAME — did you mean X?`` with the closest
    known names (difflib), else the known ones, and where to list them."""
    import difflib

    close = difflib.get_close_matches(model, known, n=2, cutoff=0.6)
    if close:
        hint = f" — did you mean {' or '.join(close)}?"
    else:
        hint = f"; models in the cluster: {', '.join(sorted(known)) or 'none'}"
    return f"unknown model {model}{hint} (`exo-p2p models` lists them)"


UNKNOWN_MODEL = re.compile(r"(?:model: )?unknown model (?P<model>\S+)(?:; models in the cluster: (?P<known>.*))?")
"""A node's 404 for a model it does not know: the master's ``unknown model NAME; models in
the cluster: A, B`` (``master.commands.unknown_model_message``; ``none`` when empty), or a
route's bare ``unknown model NAME`` (the Anthropic family's prefixed ``model: ``)."""


def reworded_unknown_model(message: str, known: list[str] | None = None) -> str | None:
    """The CLI's wording (``unknown_model_message``) of a node's unknown-model ``message``
    (``UNKNOWN_MODEL``), with the known models the message lists, else ``known``; None when
    ``message`` is not one. Without a list from either it only adds where to list them."""
    match = UNKNOWN_MODEL.fullmatch(message.strip())
    if match is None:
        return None
    listed = match["known"]
    if listed is not None:
        known = [] if listed == "none" else [m for m in listed.split(", ") if m]
    if known is None:
        return f"unknown model {match['model']} (`exo-p2p models` lists them)"
    return unknown_model_message(match["model"], known)
