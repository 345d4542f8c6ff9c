"""Which chunk each holder is asked for next during one fetch (rules: ``exo_p2p.models.transfer.fetch``).

``ChunkQueue`` holds the chunks a fetch still wants and, per chunk, the holders that may no
longer be asked for it; per holder, its strikes (failed requests in a row) and whether it is
still live. Pure: no I/O, no clock, no trio — the fetch's workers ask it what to request and
tell it what happened, so the rules are tested without peers.

The rules: a holder is never asked for a chunk it was excluded for (it failed verification,
answered ``is not held here``, or its published held map lacks it), nor for a chunk already
in flight. The hub (``HUB``) is the last source: it takes only the chunks
no live peer may still give, and asks for runs of such consecutive chunks of one file
(``run_for``) in one request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

HUB = "hub"
"""The holder id of the hub among a fetch's holders (its chunks: ``exo_p2p.models.hub.fetch``)."""
Key = tuple[str, int]
"""A chunk: (file path, chunk index)."""

HUB_RUN_BYTES = 16 * 1024 * 1024
HUB_RUN_CHUNKS = 1024
"""At most this many bytes and chunks of consecutive chunks in one hub request (``get_run``;
each chunk is written as it arrives and journaled at the copy's next checkpoint, so a
restart refetches at most what arrived since: ``exo_p2p.models.copies.partial``). Fewer, longer
requests: each costs a redirect and a round trip to the hub's CDN. The byte bound is the
one that normally ends a run: chunks are cut at every tensor's bounds, so most are far
smaller than the copy's chunk size (the embedded model's average ~110 KB, not 256 KiB)."""


class ChunkQueue:
    """The chunks ``todo`` (in the order they are asked for) still wanted from ``holders``.

    ``span(key)`` is a chunk's length in bytes (for the hub's run bound); ``runs`` says
    whether the hub answers runs of chunks (``run_for`` gives one chunk otherwise);
    ``known_held`` (peer -> path -> indices) excludes a listed peer from every chunk it does
    not list. Attributes are read by the fetch: ``todo``, ``excluded``, ``strikes``, ``live``,
    ``in_flight``; changed only through the methods (``in_flight`` by the caller, which marks
    the chunks it asks for and unmarks them when the request ends)."""

    def __init__(self, todo: list[Key], holders: Sequence[str], span: Callable[[Key], int], *,
                 known_held: Mapping[str, Mapping[str, Sequence[int]]] | None = None, runs: bool = False) -> None:
        self.todo = todo
        self.holders = holders
        self.excluded: dict[Key, set[str]] = {}
        self.strikes = {peer: 0 for peer in holders}
        self.live = set(holders)
        self.in_flight: set[Key] = set()
        self._waiting = set(todo)  # todo as a set: run_for asks often
        self._span, self._runs = span, runs
        for peer, held in (known_held or {}).items():
            sets = {p: set(idx) for p, idx in held.items()}
            for key in todo:
                if key[1] not in sets.get(key[0], ()):
                    self.excluded.setdefault(key, set()).add(peer)

    def waiting(self, key: Key) -> bool:
        """Whether ``key`` is still wanted."""
        return key in self._waiting

    def exclude(self, key: Key, peer: str) -> None:
        """Never ask ``peer`` for ``key`` again (a bad chunk, or it does not hold it)."""
        self.excluded.setdefault(key, set()).add(peer)

    def peer_could(self, key: Key) -> bool:
        """Some live holder other than the hub may still have ``key`` (the hub comes last)."""
        return any(p != HUB and p in self.live and p not in self.excluded.get(key, ()) for p in self.holders)

    def next_for(self, peer: str) -> Key | None:
        """The first wanted chunk ``peer`` may be asked for now; None when there is none."""
        for key in self.todo:
            if (key not in self.in_flight and peer not in self.excluded.get(key, ())
                    and (peer != HUB or not self.peer_could(key))):
                return key
        return None

    def run_for(self, key: Key) -> list[Key]:
        """``key`` and the chunks right after it in its file that only the hub can give, up
        to ``HUB_RUN_BYTES`` and ``HUB_RUN_CHUNKS``: one range request for them all."""
        path, _ = key
        run, size = [key], self._span(key)
        while self._runs:
            nxt = (path, run[-1][1] + 1)
            if (nxt not in self._waiting or nxt in self.in_flight or HUB in self.excluded.get(nxt, ())
                    or self.peer_could(nxt) or size + self._span(nxt) > HUB_RUN_BYTES or len(run) >= HUB_RUN_CHUNKS):
                break
            run.append(nxt)
            size += self._span(nxt)
        return run

    def idle_done(self, peer: str) -> bool:
        """Whether a worker of ``peer`` that found nothing to ask for may stop: nothing is in
        flight (a failed request would put its chunks back), and for the hub no wanted chunk
        that a peer may still fail to give."""
        return not self.in_flight and (peer != HUB or not any(self.peer_could(k) for k in self.todo))

    def accepted(self, peer: str, key: Key) -> None:
        """``peer`` gave ``key`` (verified and stored): it is no longer wanted; the peer's
        strikes start again."""
        self.strikes[peer] = 0
        self.todo.remove(key)
        self._waiting.discard(key)

    def strike(self, peer: str, max_failures: int) -> bool:
        """A request to ``peer`` failed: one strike more; True when that drops it (its
        ``max_failures``-th in a row while live)."""
        self.strikes[peer] += 1
        if self.strikes[peer] >= max_failures and peer in self.live:
            self.live.discard(peer)
            return True
        return False

    def unheld(self) -> int:
        """Wanted chunks that every holder was excluded for."""
        return sum(1 for k in self.todo if set(self.holders) <= self.excluded.get(k, set()))
