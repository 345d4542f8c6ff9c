"""Stop strings: end generation where one appears in the new text, never emitting any of it.

A stop string may span several tokens and need not be aligned with the
end of the newest text; a possible partial prefix (``"EN"`` of ``"END"``) is held back, not
emitted and then retracted.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feeds generated text through a set of stop strings.

    Guarantee: for any split of a text into deltas, the concatenation of every ``emit`` plus
    ``flush()`` is ``text[:i]`` where ``i`` is the start of the first stop occurrence to
    complete (smallest end index; ties: the longest), or the whole text when none occurs;
    no emitted prefix ever contains a stop string or the start of the one that completes. Text held back is at most
    ``max(len(stop)) - 1`` characters. Empty stop strings are ignored. After a stop has
    matched, every further ``feed`` returns ``("", True)``.
    """

    def __init__(self, stops: Sequence[str] | str = ()) -> None:
        if isinstance(stops, str):
            stops = (stops,)
        self._stops: tuple[str, ...] = tuple(s for s in dict.fromkeys(stops) if s)
        self._held = ""
        self._stopped = False
        self._matched: str | None = None

    @property
    def stopped(self) -> bool:
        """Whether a stop string has matched."""
        return self._stopped

    @property
    def matched(self) -> str | None:
        """The stop string that matched (None before one has)."""
        return self._matched

    def feed(self, text_delta: str) -> tuple[str, bool]:
        """Add newly generated text; return ``(text safe to emit now, stopped)``.

        When ``stopped`` is True, ``emit`` is the text before the stop string and generation
        should end; the held-back text is then discarded.
        """
        if self._stopped:
            return "", True
        if not self._stops:
            return text_delta, False
        buf = self._held + text_delta
        first, stop = _first_completed(buf, self._stops)
        if first >= 0:
            self._stopped = True
            self._matched = stop
            self._held = ""
            return buf[:first], True
        keep = longest_suffix_prefix(buf, self._stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """Return (and forget) the held-back text; call when generation ends for another
        reason (end-of-turn token, max_tokens). Empty after a stop matched."""
        held, self._held = self._held, ""
        return "" if self._stopped else held


def _first_completed(text: str, stops: Sequence[str]) -> tuple[int, str | None]:
    """Start index and string of the stop occurrence in ``text`` that completes first
    (smallest end; on a tie the longest, so none of it is emitted), or ``(-1, None)``.
    Generation stops as soon as a stop string completes, so this choice does not depend on
    how the text was split."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        i = text.find(stop)
        if i >= 0 and (best is None or (i + len(stop), i) < best[:2]):
            best = (i + len(stop), i, stop)
    return (-1, None) if best is None else (best[1], best[2])


def longest_suffix_prefix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``stops``
    (0 when none): what may still become a stop string (or a marker: ``output_parser``)."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best
