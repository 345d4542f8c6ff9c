"""Long prompts' share of a runner's time while streams decode: the pacer
(``worker.runner.prefill_pace``), the ranks' agreement on holding (``worker.engine.agreement``)
and the engine holding a long prompt's chunks back (``PrefillSlots.may_feed``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.engine.agreement import LocalView, decide, encode_row
from worker.runner.prefill_pace import PrefillPacer


@given(st.lists(st.tuples(st.floats(0.001, 0.5), st.booleans()), min_size=1, max_size=300))
def test_long_prefill_takes_about_its_share_while_rows_decode(steps: list[tuple[float, bool]]) -> None:
    """Steps that would each feed a long chunk when not held: over any run, the time spent
    on long chunks is at most the share of the whole plus one step (and the credit cap)."""
    pacer = PrefillPacer(share=0.3, cap=1.0)
    long_s = total = 0.0
    for decode_s, wants_long in steps:
        fed = wants_long and not pacer.hold
        seconds = decode_s + (0.2 if fed else 0.0)
        pacer.note(seconds, fed, decoding=True)
        long_s += seconds if fed else 0.0
        total += seconds
    assert long_s <= 0.3 * total + 0.7 + 1.0 + 1e-9


def test_nothing_is_held_without_rows_decoding_and_credit_restarts() -> None:
    pacer = PrefillPacer()
    pacer.note(5.0, long_fed=True, decoding=True)
    assert pacer.hold
    pacer.note(0.1, long_fed=False, decoding=False)
    assert not pacer.hold and pacer.credit == 0.0
    for _ in range(1000):
        pacer.note(0.1, long_fed=False, decoding=True)
    assert pacer.credit == pytest.approx(pacer.cap)
    with pytest.raises(ValueError):
        PrefillPacer(share=1.0)


def test_the_ranks_hold_when_any_asks() -> None:
    rows = np.stack([encode_row(LocalView(hold=False)), encode_row(LocalView(hold=True))])
    assert decide(LocalView(), rows).hold
    rows = np.stack([encode_row(LocalView()), encode_row(LocalView())])
    assert not decide(LocalView(), rows).hold
