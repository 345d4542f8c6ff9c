"""The dashboard as a new user meets it, against the real API app over a synthetic State:
Place… brings the placement panel into view (it opens below the models table, often below
the fold); on a 420 px wide page the models table stays inside its card with Place… on
screen; an answer's speed shows under the instance that served it only (the x-exo-instance
header), not under every instance of its model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import pytest

from exo_p2p.types import Instance, RunnerReady, RunnerRecord, State
from tests.dashboard.fake_backend import TOKENS, FakeCluster, ServedBackend, synthetic_state

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
WAIT_MS = 30_000
"""Milliseconds a wait for the page to show something may take: bounded only so a hang fails."""
IN_VIEW = "e => { const r = e.getBoundingClientRect(); return r.top >= -1 && r.bottom <= innerHeight + 1 && r.left >= 0 && r.right <= innerWidth; }"
"""Whether an element lies wholly inside the viewport (to a pixel: its box has fractions)."""


def two_of_one_model() -> State:
    """``synthetic_state(8)`` with a second ready instance of the model of its first (the one
    ``FakeCluster`` routes every request to)."""
    state = synthetic_state(8)
    first = next(iter(state.instances.values()))
    twin_id = "twin-" + first.instance_id[5:]
    shards = tuple(msgspec.structs.replace(sh, runner_id=f"{twin_id}-r{sh.rank}") for sh in first.shards)
    twin = Instance(instance_id=twin_id, model_id=first.model_id, sharding=first.sharding, shards=shards)
    runners = {**state.runners, **{sh.runner_id: RunnerRecord(sh.runner_id, twin_id, sh.node_id, RunnerReady()) for sh in shards}}
    return msgspec.structs.replace(state, instances={**state.instances, twin_id: twin}, runners=runners)


@pytest.fixture
def served():
    server = ServedBackend(FakeCluster(two_of_one_model(), token_delay=0.05)).start()
    try:
        yield server
    finally:
        server.close()


@contextmanager
def models_shown(browser, served, width: int, height: int) -> Iterator:
    """A page of ``width`` x ``height`` px showing the models table; closed after."""
    context = browser.new_context(viewport={"width": width, "height": height})
    try:
        page = context.new_page()
        page.goto(served.url + "/")
        page.wait_for_function("document.querySelectorAll('#models tr[data-model]').length === 5", timeout=WAIT_MS)
        yield page
    finally:
        context.close()


def test_place_brings_the_placement_panel_into_view(browser, served):
    with models_shown(browser, served, 1280, 600) as page:
        # the button at the bottom edge of the window, as after scrolling down to it: the panel
        # opens below the whole table, out of view unless the page brings it in
        button = page.locator('#models tr[data-model="phi-3"] button.place')
        button.evaluate("b => b.scrollIntoView({block: 'end'})")
        button.click()
        page.locator("#preview table.previews").wait_for(timeout=WAIT_MS)
        panel = page.locator("#preview .preview-panel")
        page.wait_for_function(f"({IN_VIEW})(document.querySelector('#preview .preview-panel'))", timeout=WAIT_MS)
        assert panel.evaluate(IN_VIEW), panel.bounding_box()


def test_a_420_px_page_keeps_the_models_table_in_its_card(browser, served):
    with models_shown(browser, served, 420, 800) as page:
        card = page.locator("section.panel", has=page.locator("#models")).bounding_box()
        table = page.locator("#models table.models").bounding_box()
        assert table["x"] >= card["x"] and table["x"] + table["width"] <= card["x"] + card["width"], (table, card)
        assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")  # the page does not scroll sideways
        for button in page.locator("#models button.place").all():
            box = button.bounding_box()
            assert card["x"] <= box["x"] and box["x"] + box["width"] <= min(card["x"] + card["width"], 420), (box, card)
            assert button.is_visible()
        assert page.locator("#models td.model-id").first.is_visible()
        button = page.locator('#models tr[data-model="phi-3"] button.place')
        button.click()
        page.locator("#preview .preview-panel").wait_for(timeout=WAIT_MS)


def test_an_answers_speed_shows_under_the_instance_that_served_it(page, served):
    state = served.backend.state()
    first = next(iter(state.instances))
    twins = [i for i, inst in state.instances.items() if inst.model_id == state.instances[first].model_id]
    assert len(twins) == 2
    page.goto(served.url + "/")
    page.wait_for_function("document.querySelectorAll('#instances .instance-card').length === 5", timeout=WAIT_MS)
    page.select_option("#chat-model", state.instances[first].model_id)
    page.fill("#chat-input", "why is the sky blue?")
    page.click("#chat-send")
    page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=WAIT_MS)
    assert page.locator("#chat-log .msg.assistant .content").last.inner_text() == "".join(TOKENS)
    served_card = page.locator(f'#instances .instance-card[data-instance-id="{first}"] .speed')
    served_card.filter(has_text="tokens/s").wait_for(timeout=WAIT_MS)
    assert served_card.inner_text().startswith("last answer ")
    other = [i for i in twins if i != first][0]
    assert page.locator(f'#instances .instance-card[data-instance-id="{other}"] .speed').inner_text() == ""
