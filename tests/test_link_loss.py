"""A link that goes down is noticed in seconds and its ring is re-placed at once
(docs/links.md#when-a-link-changes): the prober tries again soon when it could not get tickets
(the cluster's own connection ran over the lost link), and the master fails an instance whose
ring runs over a retracted address instead of waiting for its ranks to be killed as stuck."""

from __future__ import annotations

import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.links.prober import RETRY_SOON, PeerMemory, Prober
from exo_p2p.links.figures import RTT_EVERY
from exo_p2p.types import InstanceFailed, LinkFigures, LinkLost, TaskDeleted, TaskStatusUpdated
from master.placement.place import place_instance
from master.reactions import react, ring_over
from tests.support.rules.relink_figures import FAST, MODEL, SLOW, _figures, _state
from tests.support.rules.restore_size import _ready, _task, _with

pytestmark = pytest.mark.unit


def _on_fast():  # type: ignore[no-untyped-def]
    state = _state(_figures((110, 1_000_000_000)))
    inst = place_instance(state, MODEL, min_nodes=2, instance_id="i")
    assert {s.ring_address.rsplit(":", 1)[0] for s in inst.shards} == set(FAST.values())
    return _task(_ready(_with(state, inst), inst), "t1", "i"), inst


def test_an_instance_whose_ring_address_is_lost_fails_at_once_with_its_tasks():
    state, inst = _on_fast()
    r0, r1 = inst.shards
    # the hop rank 0 -> rank 1 is at rank 1's ring address; the closing hop at rank 0's
    assert ring_over(state, r0.node_id, r1.node_id, FAST[r1.node_id]) == ["i"]
    assert ring_over(state, r1.node_id, r0.node_id, FAST[r0.node_id]) == ["i"]
    assert ring_over(state, r1.node_id, r0.node_id, FAST[r1.node_id]) == []  # not a hop of the ring
    lost = LinkLost(r0.node_id, r1.node_id, FAST[r1.node_id])
    gone = msgspec.structs.replace(state, links=_figures(None))  # react sees the State with the event applied
    events = react(gone, lost)
    assert isinstance(events[0], InstanceFailed) and events[0].instance_id == "i"
    assert FAST[r1.node_id] in events[0].reason
    assert events[1:] == (TaskStatusUpdated("t1", "failed"), TaskDeleted("t1"))
    # another address of the pair, or an instance already failed: nothing
    assert react(state, LinkLost(r0.node_id, r1.node_id, SLOW[r1.node_id])) == ()
    failed = _with(state, msgspec.structs.replace(inst, failed_reason="x"))
    assert react(failed, lost) == ()


def test_a_round_without_tickets_is_tried_again_soon_not_a_full_round_later():
    class DeadConnection:
        async def request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise TimeoutError("the connection ran over the lost link")

    now = [100.0]
    prober = Prober(DeadConnection(), "n0", lambda: _state({}), lambda e: None, clock=lambda: now[0])  # type: ignore[arg-type]
    mem = PeerMemory()
    trio.run(prober._measure_peer, "n1", (("10.1.0.2", "ethernet"),), mem)
    assert mem.due == pytest.approx(100.0 + RETRY_SOON)
    assert RETRY_SOON < RTT_EVERY / 5


def test_the_re_placement_does_not_take_the_other_end_of_the_lost_link():
    """One node noticed the fast link down (its figures of the peer's fast address retracted),
    the other not yet: the re-placement runs both hops over the slow link, not the closing hop
    over the dead link's other end; once neither has the fast link, the same."""
    from master.replace import replacement, without_lost_links

    state, inst = _on_fast()
    r0, r1 = inst.shards
    links = _figures((110, 1_000_000_000))
    del links[r0.node_id][r1.node_id][FAST[r1.node_id]]  # rank 0's node lost rank 1's fast address
    half = msgspec.structs.replace(state, links=links, tasks={})
    failed = msgspec.structs.replace(inst, failed_reason="its ring ran over ...", served=True)
    half = _with(half, failed)
    assert without_lost_links(half, failed).links[r1.node_id][r0.node_id].keys() == {SLOW[r0.node_id]}
    _, created = replacement(half, failed, "j")
    assert {s.ring_address.rsplit(":", 1)[0] for s in created.instance.shards} == set(SLOW.values())  # type: ignore[attr-defined]
    # no hop lost (a runner died): the view is unchanged, the ring stays on the fast link
    whole = _with(msgspec.structs.replace(state, tasks={}), failed)
    assert without_lost_links(whole, failed) is whole
    _, again = replacement(whole, failed, "k")
    assert {s.ring_address.rsplit(":", 1)[0] for s in again.instance.shards} == set(FAST.values())  # type: ignore[attr-defined]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["n0", "n1"]), st.sampled_from(["n0", "n1"]),
                          st.sampled_from(["10.1.0.1", "10.1.0.2", "10.2.0.1", "10.2.0.2"])), max_size=8))
def test_without_lost_links_only_drops_figures_and_never_a_pairs_last_address(kept):
    """Whatever figures State still holds of the failed ring's pair, the view only drops some
    (never adds, never changes one) and never empties a pair it had figures for."""
    from master.replace import without_lost_links

    _, inst = _on_fast()
    links: dict = {}
    for a, b, ip in kept:
        if a != b:
            links.setdefault(a, {}).setdefault(b, {})[ip] = LinkFigures(ip, 100, 10**9, "ethernet")
    state = msgspec.structs.replace(_state({}), links=links)
    view = without_lost_links(state, inst).links
    for a, sinks in links.items():
        for b, figs in sinks.items():
            assert set(view[a][b]) <= set(figs) and view[a][b], (a, b)
            assert all(view[a][b][ip] == figs[ip] for ip in view[a][b])
