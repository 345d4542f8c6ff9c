"""The dashboard's instance cards show placement on demand and idle unload (docs/models.md
"Placement on demand and idle unload"), against the real API app over the synthetic State of
``fake_backend`` with ``State.usage`` entries (no cluster): an instance placed on demand shows
when it is unloaded once idle and when it was last used, a pinned one "pinned", one placed by
hand "until deleted", and one a request placed that still loads "loading on demand". The
pure functions (``static/model.js``) are checked in the browser too."""

from __future__ import annotations

import msgspec
import pytest

from exo_p2p.types import InstanceUsage, State
from tests.dashboard.fake_backend import FakeCluster, ServedBackend, synthetic_state

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
WAIT_MS = 30_000
"""Milliseconds a wait for the page to show something may take: bounded only so a hang fails."""
T0 = 1_700_000_000.0


def usage_state() -> State:
    """``synthetic_state(8)`` with keep-alives: llama-8b (ready) placed on demand, 300 s;
    qwen-14b (ready) pinned; phi-3 (loading) placed on demand; mistral-7b (failed) by hand."""
    state = synthetic_state(8)
    by_model = {inst.model_id: iid for iid, inst in state.instances.items()}
    usage = {
        by_model["llama-8b"]: InstanceUsage(last_used=T0, keep_alive=300.0, on_demand=True, served=True),
        by_model["qwen-14b"]: InstanceUsage(last_used=T0 + 5, keep_alive=60.0, pinned=True),
        by_model["phi-3"]: InstanceUsage(last_used=T0 + 9, keep_alive=300.0, on_demand=True),
    }
    return msgspec.structs.replace(state, usage=usage)


@pytest.fixture
def served():
    server = ServedBackend(FakeCluster(usage_state())).start()
    try:
        yield server
    finally:
        server.close()


def _card(page, model: str):
    return page.locator("#instances .instance-card").filter(has=page.locator(".instance-model", has_text=model))


def test_instance_cards_show_expiry_last_use_and_loading_on_demand(page, served):
    page.goto(served.url + "/")
    page.wait_for_function("document.querySelectorAll('#instances .instance-card').length === 4", timeout=WAIT_MS)
    clock = lambda t: page.evaluate("async (t) => (await import('/dashboard/model.js')).localTime(t)", t)  # noqa: E731
    on_demand = _card(page, "llama-8b")
    assert on_demand.locator(".keep-alive").inner_text() == f"idle unload at {clock(T0 + 300)} · last used {clock(T0)}"
    assert on_demand.locator(".status").inner_text().lower() == "ready"
    assert _card(page, "qwen-14b").locator(".keep-alive").inner_text() == f"pinned · last used {clock(T0 + 5)}"
    assert _card(page, "mistral-7b").locator(".keep-alive").inner_text() == "until deleted"
    loading = _card(page, "phi-3")
    assert loading.get_attribute("data-status") == "loading"
    assert loading.locator(".status").inner_text().lower() == "loading on demand"
    assert "3/8 layers loaded" in loading.inner_text()
    # a use moves the deadline: the card follows the next poll
    iid = next(i for i, inst in served.backend.state().instances.items() if inst.model_id == "llama-8b")

    def used() -> None:
        state = served.backend._state
        entry = msgspec.structs.replace(state.usage[iid], last_used=T0 + 100)
        served.backend._state = msgspec.structs.replace(state, usage={**state.usage, iid: entry})

    served.call(used)
    expected = f"idle unload at {clock(T0 + 400)} · last used {clock(T0 + 100)}"
    page.wait_for_function("(t) => [...document.querySelectorAll('#instances .keep-alive')].some((e) => e.textContent === t)",
                           arg=expected, timeout=WAIT_MS)


JS_CASES = """
async () => {
  const m = await import('/dashboard/model.js');
  const c = (t) => `t${t}`;
  return {
    byHand: m.keepAliveText({status: 'ready'}, c),
    byHandNull: m.keepAliveText({status: 'ready', last_used: null, expires_at: null}, c),
    pinned: m.keepAliveText({pinned: true, last_used: 5, expires_at: null}, c),
    forever: m.keepAliveText({last_used: 5, expires_at: null, keep_alive: null}, c),
    idle: m.keepAliveText({last_used: 5, expires_at: 305, keep_alive: 300}, c),
    zero: m.keepAliveText({last_used: 5, expires_at: 5, keep_alive: 0}, c),
    statuses: [m.statusText({status: 'loading', on_demand: true}), m.statusText({status: 'loading', on_demand: false}),
               m.statusText({status: 'ready', on_demand: true}), m.statusText({status: 'failed'})],
    clock: m.localTime(0).split(':').length,
  };
}
"""


def test_keep_alive_functions_in_the_browser(page, served):
    page.goto(served.url + "/dashboard/index.html")
    out = page.evaluate(JS_CASES)
    assert out["byHand"] == out["byHandNull"] == "until deleted"
    assert out["pinned"] == "pinned · last used t5"
    assert out["forever"] == "kept forever · last used t5"
    assert out["idle"] == "idle unload at t305 · last used t5"
    assert out["zero"] == "idle unload at t5 · last used t5"
    assert out["statuses"] == ["loading on demand", "loading", "ready", "failed"]
    assert out["clock"] == 3  # hh:mm:ss
