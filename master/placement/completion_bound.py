"""The weight bound of the cycle branch and bound: the most a path's completion can weigh.

Nodes are indices in weight order (heaviest first, as ``CycleSearch`` numbers them), sets of
them bit masks. A path from ``start`` (its rank-0 node) can only be completed with later
nodes; the heaviest completion through a child ``j`` holds j, the required nodes the path
still misses ("forced") and the heaviest other nodes ("free") for the slots left — with a
host among them when the cycle must include one and has none yet. ``CompletionBound`` gives
that weight per child (``master.placement.branch_and_bound`` cuts a child whose bound cannot
reach ``min_weight`` or beat the best cycle so far).
"""

from __future__ import annotations

from dataclasses import dataclass


def heaviest_free(start: int, count: int, taken: int, n: int, host_mask: int, need_host: bool) -> tuple[list[int], int | None]:
    """The heaviest ``n`` node indices in ``(start, count)`` not in the mask ``taken`` (weight
    order; all of them when fewer), extended to the first host (a node of ``host_mask``) when
    ``need_host``; and that host's position in the list (None: none, or not needed)."""
    free: list[int] = []
    first_host = None
    i = start + 1
    while i < count and (len(free) < n or (need_host and first_host is None)):
        if not taken >> i & 1:
            if need_host and first_host is None and host_mask >> i & 1:
                first_host = len(free)
            free.append(i)
        i += 1
    return free, first_host


@dataclass(frozen=True)
class CompletionBound:
    """The nodes a completion of one path may still use, for its optimistic weight: the
    required nodes still missing (``forced``, their weight ``forced_w``) and the heaviest other
    nodes after start (``free``, weight order; ``prefix`` their running sums, ``pos`` their
    places), with ``first_host`` the place of the first host in ``free`` when one is needed.
    ``left``: the slots after the path's next node. Build it with ``completion_bound``."""

    w: list[int]
    forced_mask: int
    host_mask: int
    need_host: bool
    left: int
    forced: list[int]
    forced_w: int
    free: list[int]
    first_host: int | None
    prefix: list[int]
    pos: dict[int, int]

    def extra_weight(self, j: int) -> int | None:
        """The most weight (bytes) a completion through child ``j`` adds to the path: j, the
        forced nodes and the heaviest free nodes for the slots left — with a host among them
        when one is still needed. None when no completion through ``j`` can hold them."""
        w, free, forced = self.w, self.free, self.forced
        j_forced = self.forced_mask >> j & 1
        slots = self.left - (len(forced) - j_forced)  # free slots after j
        j_free_pos = None if j_forced else self.pos.get(j)
        if slots < 0 or len(free) - (j_free_pos is not None) < slots:
            return None
        if j_free_pos is not None and j_free_pos < slots:
            end, window = slots + 1, self.prefix[slots + 1] - w[j]
        else:
            end, window = slots, self.prefix[slots]
        if self.need_host and not self.host_mask >> j & 1:
            if self.first_host is None or slots == 0:
                return None
            if self.first_host >= end:
                window += w[free[self.first_host]] - w[free[end - 1]]
        return self.forced_w + window + (0 if j_forced else w[j])


def completion_bound(
    w: list[int], start: int, count: int, mask: int, required: list[int], forced_mask: int, host_mask: int,
    left: int, need_host: bool,
) -> CompletionBound:
    """The ``CompletionBound`` of a path from ``start`` over the nodes ``mask``, with ``left``
    slots after its next node: ``w`` the weights by index, ``count`` the nodes usable,
    ``required`` the required indices, ``forced_mask`` those the path misses, ``host_mask``
    the hosts (-1: none needed), ``need_host`` whether the path still needs one."""
    forced = [i for i in required if i > start and forced_mask >> i & 1]
    free, first_host = heaviest_free(start, count, mask | forced_mask, left - len(forced) + 2, host_mask, need_host)
    prefix = [0]
    for i in free:
        prefix.append(prefix[-1] + w[i])
    pos = {i: p for p, i in enumerate(free)}
    return CompletionBound(w, forced_mask, host_mask, need_host, left, forced, sum(w[i] for i in forced),
                           free, first_host, prefix, pos)
