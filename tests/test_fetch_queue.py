"""The rules of who is asked for which chunk during a fetch (``exo_p2p.models.transfer.fetch_queue``):
pure, no peers."""

from __future__ import annotations

import pytest

from exo_p2p.models.transfer import fetch_queue
from exo_p2p.models.transfer.fetch_queue import ChunkQueue
from exo_p2p.models.transfer.fetch_queue import HUB


def _queue(todo, holders, *, size=10, **kw) -> ChunkQueue:
    return ChunkQueue(list(todo), holders, lambda key: size, **kw)


def test_a_peer_gets_the_first_chunk_not_in_flight_and_not_excluded_for_it():
    q = _queue([("f", 0), ("f", 1), ("f", 2)], ["a", "b"])
    assert q.next_for("a") == ("f", 0)
    q.in_flight.add(("f", 0))
    q.exclude(("f", 1), "a")
    assert q.next_for("a") == ("f", 2)
    assert q.next_for("b") == ("f", 1)


def test_a_peers_published_held_map_excludes_it_from_what_it_lacks():
    q = _queue([("f", 0), ("f", 1), ("g", 0)], ["a", "b"], known_held={"a": {"f": [1]}})
    assert q.excluded == {("f", 0): {"a"}, ("g", 0): {"a"}}
    assert q.next_for("a") == ("f", 1)
    assert q.next_for("b") == ("f", 0)


def test_the_hub_takes_only_what_no_live_peer_may_still_give():
    q = _queue([("f", 0), ("f", 1)], ["a", HUB])
    assert q.next_for(HUB) is None and not q.idle_done(HUB)  # peer a may still give both
    q.exclude(("f", 0), "a")
    assert q.next_for(HUB) == ("f", 0)
    assert q.strike("a", 1) and "a" not in q.live
    assert q.next_for(HUB) == ("f", 0) and q.peer_could(("f", 1)) is False


def test_a_hub_run_is_consecutive_wanted_chunks_no_peer_can_give_within_its_bounds(monkeypatch):
    keys = [("f", i) for i in range(6)]
    q = _queue(keys, [HUB], size=4, runs=True)
    assert q.run_for(("f", 0)) == keys
    q.in_flight.add(("f", 3))
    assert q.run_for(("f", 0)) == keys[:3]  # stops at a chunk in flight
    monkeypatch.setattr(fetch_queue, "HUB_RUN_CHUNKS", 2)
    assert q.run_for(("f", 4)) == keys[4:]
    assert q.run_for(("f", 0)) == keys[:2]
    monkeypatch.setattr(fetch_queue, "HUB_RUN_BYTES", 4)
    assert q.run_for(("f", 0)) == keys[:1]
    assert _queue(keys, [HUB], runs=False).run_for(("f", 0)) == [("f", 0)]  # no get_run: one chunk


def test_strikes_drop_a_peer_after_max_failures_in_a_row_and_an_accepted_chunk_resets_them():
    q = _queue([("f", 0), ("f", 1)], ["a"])
    assert not q.strike("a", 2)
    q.accepted("a", ("f", 0))
    assert q.strikes["a"] == 0 and q.todo == [("f", 1)] and not q.waiting(("f", 0))
    assert not q.strike("a", 2)
    assert q.strike("a", 2)
    assert not q.strike("a", 2)  # dropped once
    assert q.live == set()


@pytest.mark.parametrize("excluded, unheld", [({}, 0), ({"a"}, 0), ({"a", "b"}, 1)])
def test_unheld_counts_chunks_every_holder_was_excluded_for(excluded, unheld):
    q = _queue([("f", 0), ("f", 1)], ["a", "b"])
    for peer in excluded:
        q.exclude(("f", 0), peer)
    assert q.unheld() == unheld


def test_a_worker_waits_while_chunks_are_in_flight():
    q = _queue([("f", 0)], ["a", "b"])
    q.in_flight.add(("f", 0))
    assert q.next_for("b") is None and not q.idle_done("b")
    q.in_flight.clear()
    q.exclude(("f", 0), "b")
    assert q.next_for("b") is None and q.idle_done("b")
