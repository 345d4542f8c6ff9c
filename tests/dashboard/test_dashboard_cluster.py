"""The dashboard in headless chromium against real node processes.

One 2-node cluster (``alpha``, ``beta``; the tiny synthetic model in ``--models-dir``) and one
browser for the module; the tests run in file order on that cluster: the page shows both
nodes with their memory; the tiny model is placed from the page (previews first) and its
instance reaches ready; a chat answer streams token by token with TTFT and tokens/s; Stop
cancels the request (the task leaves State); Delete removes the instance; a killed node
leaves the page within the peer timeout (5 s) + 2 s. A separate node with ``--api-key``:
the page shows nothing of the cluster before the key is entered, and works after.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess, converged, nodes_cleanup, wait_until
from tests.support.cancel_bounds import CANCEL_BOUND, cancel_bound

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
MODEL = "tiny"
PEER_TIMEOUT = 5.0
PAGE_SLACK = 2.0
WAIT_MS = 30_000
"""Milliseconds a wait for the page to show something may take: generous (a poll and a render
take well under a second alone, several times that beside other workers), bounded only so a
hang fails."""
API_KEY = "dashboard-test-key"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    make_synthetic_model(d / MODEL, n_layers=6, hidden_size=128, intermediate_size=256, seed=5)
    return d


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, models_dir):
    base = tmp_path_factory.mktemp("dash-cluster")
    name = f"dash-{time.monotonic_ns():x}"
    common = ["--models-dir", str(models_dir)]
    with nodes_cleanup([]) as nodes:
        alpha = NodeProcess(base / "alpha", cluster=name, extra_args=[*common, "--name", "alpha"]).start()
        nodes.append(alpha)
        boot = [x for a in alpha.addrs() for x in ("--bootstrap", a)]
        beta = NodeProcess(base / "beta", cluster=name, extra_args=[*common, "--name", "beta", *boot]).start()
        nodes.append(beta)
        wait_until(lambda: converged(nodes, 2), 60, what="2-node cluster")
        yield nodes


@pytest.fixture(scope="module")
def shared_page(browser, cluster):
    """One page on alpha's API for the ordered tests of this module."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(cluster[0].url + "/")
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def gib(n: int) -> str:
    """formatBytes of the page for a byte count (powers of 1024, as the page prints them)."""
    value, unit = float(n), 0
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and unit < 4:
        value /= 1024
        unit += 1
    digits = 0 if unit == 0 or value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{digits}f} {units[unit]}"


def test_page_shows_both_nodes_with_names_and_memory(shared_page, cluster):
    page = shared_page
    page.wait_for_function("document.querySelectorAll('#nodes .node-card').length === 2", timeout=WAIT_MS)
    state = cluster[0].get("/state").json()
    names = sorted(page.locator("#nodes .node-name").all_inner_texts())
    assert names == ["alpha", "beta"]
    for node_id, profile in state["nodes"].items():
        card = page.locator(f'#nodes .node-card[data-node-id="{node_id}"]')
        assert profile["friendly_name"] in card.inner_text()
        assert f"{gib(profile['memory_total'])} memory" in card.locator("header").inner_text()
        assert "free" in card.locator(".mem-legend").inner_text() and "shards" in card.locator(".mem-legend").inner_text()
        assert card.locator(".mem-bar .seg.other").count() == 1
        assert "tiny" in card.locator(".node-models").inner_text()
    master = page.locator("#nodes .node-card", has=page.locator(".badge.master"))
    assert master.count() == 1 and master.get_attribute("data-node-id") == state["master"]
    assert page.locator("#graph svg .graph-node").count() == 2
    assert page.locator("#graph svg .link").count() == 1
    # the nodes record no interface kind: the label says what the address is, and its
    # measured figures once the link probes have published them (docs/links.md)
    label = page.locator("#graph svg .link-label").text_content()
    assert re.fullmatch(r"loopback · 127\.0\.0\.1( [\d.]+ ms( [\d.]+ [kMG]bit/s)?)?", label or ""), label
    # both on this machine: each card's "other" memory is explained and names the other node
    for node_id, profile in state["nodes"].items():
        card = page.locator(f'#nodes .node-card[data-node-id="{node_id}"]')
        other_name = next(p["friendly_name"] for n, p in state["nodes"].items() if n != node_id)
        assert "other processes" in card.locator(".mem-legend .other-memory").get_attribute("title")
        assert card.locator(".mem-note").inner_text().startswith(f"other includes {other_name} ")
        assert card.locator(".node-facts .disk-free").is_visible()
    assert page.locator("#forget-key").is_hidden()  # no API key in use


def test_place_from_page_shows_previews_then_reaches_ready(shared_page, cluster):
    page = shared_page
    page.locator(f'#models tr[data-model="{MODEL}"] button.place').click()
    two_nodes = page.locator("#preview table.previews tbody tr", has_text="alpha").filter(has_text="beta").filter(has_text="pipeline")
    two_nodes.first.wait_for(timeout=10000)
    assert "3 + 3" in two_nodes.first.inner_text()  # layers per node, shown before confirming
    two_nodes.first.locator("button.confirm").click()
    card = page.locator("#instances .instance-card")
    card.first.wait_for(timeout=35000)
    # the page's poll may show the new instance before the POST's answer (the master answers
    # once the placement is committed) closes the panel: it closes within the POST's bound
    page.locator("#preview .preview-panel").wait_for(state="detached", timeout=35000)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = card.first.get_attribute("data-status")
        if status == "ready":
            break
        assert status != "failed", card.first.inner_text()
        time.sleep(0.1)
    assert card.first.get_attribute("data-status") == "ready", cluster[0].log_tail()
    assert float(card.first.locator("progress.load").evaluate("p => p.value")) == 1.0
    assert "6/6 layers loaded" in card.first.inner_text()
    rows = card.first.locator("table.shards tbody tr")
    assert rows.count() == 2
    assert {rows.nth(0).locator("td").nth(2).inner_text(), rows.nth(1).locator("td").nth(2).inner_text()} == {"alpha", "beta"}
    assert [rows.nth(i).locator("td.runner").inner_text() for i in range(2)] == ["ready", "ready"]
    instances = cluster[0].get("/instances").json()
    assert len(instances) == 1 and len(instances[0]["shards"]) == 2


def _answer_text(page) -> str:
    return page.locator("#chat-log .msg.assistant .content").last.inner_text()


def test_chat_streams_tokens_with_ttft_and_tokens_per_second(shared_page, cluster):
    page = shared_page
    page.wait_for_function(f"document.querySelector('#chat-model').value === '{MODEL}'", timeout=WAIT_MS)
    page.fill("#chat-max-tokens", "40")
    page.fill("#chat-temperature", "0")
    page.fill("#chat-input", "hello there")
    page.click("#chat-send")
    lengths = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lengths.append(len(_answer_text(page)))
        if page.locator("#chat-log .msg.assistant.streaming").count() == 0:
            break
        time.sleep(0.02)
    assert page.locator("#chat-log .msg.assistant.streaming").count() == 0, "the answer did not finish"
    growing = sorted(set(n for n in lengths if n > 0))
    assert len(growing) >= 3, f"the answer did not stream (lengths seen: {growing})"
    stats = page.locator("#chat-log .msg.assistant .stats").last.inner_text()
    assert "TTFT" in stats and "tokens/s" in stats and "40 tokens" in stats, stats
    assert page.locator("#chat-log .msg.user").last.inner_text().endswith("hello there")


def test_stop_cancels_the_request(shared_page, cluster):
    page = shared_page
    page.fill("#chat-max-tokens", "1000")
    page.fill("#chat-temperature", "0")
    page.fill("#chat-input", "go on forever")
    page.click("#chat-send")
    page.wait_for_function("document.querySelector('#chat-log .msg.assistant:last-child .content').textContent.length > 5", timeout=30000)
    wait_until(lambda: any(cluster[0].get("/state").json()["tasks"]), 5, interval=0.05, what="the task in State")
    page.click("#chat-stop")
    page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=WAIT_MS)
    stats = page.locator("#chat-log .msg.assistant .stats").last.inner_text()
    assert "stopped" in stats, stats
    # CANCEL_BOUND, or more if the stream decoded slowly (its tokens/s, as the page shows it)
    import re

    speed = re.search(r"([0-9.]+) tokens/s", stats)
    bound = cancel_bound(1 / float(speed.group(1))) if speed and float(speed.group(1)) > 0 else CANCEL_BOUND
    wait_until(lambda: all(not n.get("/state").json()["tasks"] for n in cluster), bound, interval=0.1, what="the cancelled task to leave State")
    text = _answer_text(page)
    time.sleep(0.5)
    assert _answer_text(page) == text, "text kept arriving after Stop"
    assert not page.locator("#chat-send").is_disabled() and page.locator("#chat-stop").is_disabled()


def test_delete_removes_the_instance(shared_page, cluster):
    page = shared_page
    page.locator("#instances .instance-card button.delete").first.click()
    page.wait_for_function("document.querySelectorAll('#instances .instance-card').length === 0", timeout=35000)
    assert cluster[0].get("/instances").json() == []
    page.wait_for_function("document.querySelector('#chat-model').value === ''", timeout=WAIT_MS)


def test_killed_node_disappears_within_peer_timeout(shared_page, cluster):
    page = shared_page
    beta = cluster[1]
    beta_id = next(n["node_id"] for n in beta.get("/nodes").json() if n["is_self"])
    assert page.locator(f'#nodes .node-card[data-node-id="{beta_id}"]').count() == 1
    beta.kill()
    killed = time.monotonic()
    page.wait_for_function(
        f"!document.querySelector('#nodes .node-card[data-node-id=\"{beta_id}\"]')",
        timeout=(PEER_TIMEOUT + PAGE_SLACK + 3) * 1000,
    )
    gone_after = time.monotonic() - killed
    print(f"killed node left the page after {gone_after:.2f} s")
    assert gone_after <= PEER_TIMEOUT + PAGE_SLACK
    assert page.locator("#graph svg .graph-node").count() == 1


def test_api_key_page_shows_nothing_before_the_key_and_works_after(browser, tmp_path):
    with nodes_cleanup([]) as nodes:
        node = NodeProcess(tmp_path / "keyed", extra_args=["--name", "keyed", "--api-key", API_KEY])
        node.headers = {"authorization": f"Bearer {API_KEY}"}
        nodes.append(node.start())
        context = browser.new_context()
        page = context.new_page()
        try:
            page.goto(node.url + "/")
            page.locator("#key-dialog").wait_for(state="visible", timeout=WAIT_MS)
            time.sleep(1.0)  # several poll periods: still nothing of the cluster
            assert page.locator("#app").is_hidden()
            assert page.locator("#nodes .node-card").count() == 0
            assert "keyed" not in page.locator("body").inner_text()
            page.fill("#key-input", "wrong-key")
            page.click("#key-submit")
            page.wait_for_function("document.querySelector('#key-error').textContent.includes('refused')", timeout=WAIT_MS)
            assert page.locator("#app").is_hidden()
            page.fill("#key-input", API_KEY)
            page.click("#key-submit")
            page.locator("#nodes .node-card").first.wait_for(timeout=WAIT_MS)
            assert page.locator("#nodes .node-name").inner_text() == "keyed"
            assert page.locator("#key-dialog").is_hidden()
            page.reload()  # the key is kept in the browser
            page.locator("#nodes .node-card").first.wait_for(timeout=WAIT_MS)
            assert page.locator("#key-dialog").is_hidden()
        finally:
            context.close()


def test_failed_instance_shows_the_runners_reason(browser, tmp_path, models_dir):
    """A runner that fails while loading (the node's test fault hook): the page shows the
    instance failed and why, as the node reports it."""
    with nodes_cleanup([]) as nodes:
        node = NodeProcess(tmp_path / "faulty", extra_args=["--models-dir", str(models_dir), "--name", "faulty", "--fault-hook", "fail=loading"])
        nodes.append(node.start())
        context = browser.new_context()
        page = context.new_page()
        try:
            page.goto(node.url + "/")
            page.locator(f'#models tr[data-model="{MODEL}"] button.place').click()
            page.locator("#preview button.confirm").first.click()
            failed = page.locator('#instances .instance-card[data-status="failed"] .failure')
            failed.first.wait_for(timeout=60_000)  # a runner start, its MLX import (over 10 s on a loaded machine), then the failure
            assert "fault hook: failure during load" in failed.first.inner_text()
        finally:
            context.close()
