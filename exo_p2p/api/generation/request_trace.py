"""``RequestTrace``: what one generation request did, noted as it is answered, turned into
its ``RequestRecord`` at the end (``exo_p2p.api.generation.path`` and ``exo_p2p.api.generation.serving_task`` call it; docs/operations.md).

It reads the chunks handed to the client (the first token's time, the last chunk's counts),
the master's answers (instance, route) and the outcome the shared path settles on; it never
changes what the client gets. Its status is the HTTP status the client saw: the one in the
outcome (``refused 503``, ``error 400 before output``), 200 for an answer or a stream that
began, 499 when the client went away before an answer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from exo_p2p.types import Chunk, CommandResult, ErrorChunk, FinishChunk, State, TokenChunk
from exo_p2p.types.observe import RequestRecord

MAX_TEXT_CHARS = 65_536
"""Characters of prompt and output a record keeps at most when text is logged."""
_STATUS = re.compile(r"\b([1-5]\d\d)\b")


def prompt_text(messages: tuple, prompt: str | None) -> str:
    """The request's text as one string (the raw prompt, or ``role: content`` lines)."""
    if prompt is not None:
        return prompt[:MAX_TEXT_CHARS]
    return "\n".join(f"{m.role}: {m.content}" for m in messages)[:MAX_TEXT_CHARS]


def outcome_word(outcome: str) -> str:
    """The record's one-word outcome: complete, streamed, error, refused, disconnected or
    unanswered."""
    if outcome.startswith("client disconnected"):
        return "disconnected"
    return outcome.split(",", 1)[0].split(" ", 1)[0]


class RequestTrace:
    """One request's facts so far. ``clock``: monotonic seconds; ``wall``: Unix seconds;
    ``keep_text``: keep the prompt and output (``--log-request-text``)."""

    def __init__(self, request_id: str, family: str, model: str, *, key_id: str | None = None,
                 keep_text: bool = False, prompt: str | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.request_id, self.family, self.model, self.key_id = request_id, family, model, key_id
        self._clock = clock
        self.started_wall = wall()
        self.started = clock()
        self.first_token: float | None = None
        self.finish: FinishChunk | None = None
        self.finished_at = 0.0
        self.error: ErrorChunk | None = None
        self.instance: str | None = None
        self.route: str | None = None
        self.routed_at: float | None = None
        self.moves = 0
        self.keep_text = keep_text
        self.prompt = prompt if keep_text else None
        self._output: list[str] = []
        self._output_chars = 0
        self.streamed = False

    def routed(self, result: CommandResult) -> None:
        """The master accepted a task of this request on ``result.instance_id``."""
        if result.error is None:
            self.instance, self.route = result.instance_id, result.route or self.route
            if self.routed_at is None:
                self.routed_at = self._clock()

    def chunk(self, chunk: Chunk) -> None:
        """A chunk handed to the client."""
        if isinstance(chunk, TokenChunk):
            if self.first_token is None:
                self.first_token = self._clock()
            if self.keep_text and self._output_chars < MAX_TEXT_CHARS:
                self._output.append(chunk.text)
                self._output_chars += len(chunk.text)
        elif isinstance(chunk, FinishChunk):
            self.finish, self.finished_at = chunk, self._clock()
        elif isinstance(chunk, ErrorChunk):
            self.error = chunk

    def status(self, outcome: str) -> int:
        """The HTTP status the client saw, from the shared path's ``outcome`` (module docstring)."""
        if outcome.startswith("client disconnected") and not self.streamed:
            return 499
        if outcome.startswith(("streamed", "complete")) or self.streamed:
            return 200
        found = _STATUS.search(outcome)
        return int(found.group(1)) if found else 500

    def record(self, outcome: str, state: State | None = None) -> RequestRecord:
        """The request's record, with ``outcome`` as the shared path ended it; ``state``
        gives the nodes of its instance."""
        now = self._clock()
        fin = self.finish
        nodes: tuple[str, ...] = ()
        if state is not None and self.instance is not None:
            inst = state.instances.get(self.instance)  # type: ignore[call-overload]
            nodes = tuple(sh.node_id for sh in inst.shards) if inst is not None else ()
        ttft = None if self.first_token is None else round(self.first_token - self.started, 4)
        timed = fin if fin is not None and fin.completion_tokens > 0 else None  # a first token came
        tps = None
        if fin is not None and self.first_token is not None and fin.completion_tokens > 1 and self.finished_at > self.first_token:
            tps = round((fin.completion_tokens - 1) / (self.finished_at - self.first_token), 3)
        return RequestRecord(
            request_id=self.request_id, family=self.family, model=self.model, status=self.status(outcome),
            outcome=outcome_word(outcome), started=round(self.started_wall, 3),
            duration=round(now - self.started, 4), instance=self.instance, nodes=nodes,
            finish_reason=fin.finish_reason if fin is not None else None,
            prompt_tokens=fin.prompt_tokens if fin is not None else 0,
            cached_tokens=fin.cached_tokens if fin is not None else 0,
            draft_proposed=fin.draft_proposed if fin is not None else 0,
            draft_accepted=fin.draft_accepted if fin is not None else 0,
            completion_tokens=fin.completion_tokens if fin is not None else 0,
            ttft=ttft, decode_tps=tps, moves=self.moves, key_id=self.key_id, route=self.route,
            routed=None if self.routed_at is None else round(self.routed_at - self.started, 4),
            runner_ttft=round(timed.ttft, 4) if timed else None, runner_queued=round(timed.queued, 4) if timed else None,
            prompt=self.prompt, output="".join(self._output)[:MAX_TEXT_CHARS] if self.keep_text else None,
        )
