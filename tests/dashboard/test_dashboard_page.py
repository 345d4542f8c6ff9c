"""The dashboard page against the real API app over a synthetic State (no cluster): a State
of 8 nodes and 4 instances stays usable, errors are shown (a refused placement gives the
master's reason, a failed instance why it failed), a lost connection is shown and recovered
from by itself, and the page's pure functions (``static/model.js``) run in the browser.
Also ``GET /`` content negotiation and the assets served without an API key (no browser)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from exo_p2p.api.access import AccessPolicy
from tests.dashboard.fake_backend import FAILURE, REFUSAL, REFUSED_MODEL, TOKENS, FakeCluster, ServedBackend, synthetic_state

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
WAIT_MS = 30_000
"""Milliseconds a wait for the page to show something may take: generous (a first render takes
~0.5 s alone, several times that beside other workers), bounded only so a hang fails; the page's
speed is asserted in CPU time (``test_eight_nodes_and_four_instances_stay_usable``)."""


def raw_get(port: int, path: str) -> tuple[int, bytes]:
    """``GET path`` sent byte for byte (httpx would normalize ``..``); (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def cpu_seconds() -> float:
    """CPU seconds used so far by this process (its server thread included) and its live
    descendants (the browser's processes, Playwright's driver): a loaded machine stretches the
    wall time of the page's work, not this."""
    import psutil

    total = time.process_time()
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


@pytest.fixture
def served():
    server = ServedBackend(FakeCluster(synthetic_state(8))).start()
    try:
        yield server
    finally:
        server.close()


def test_root_is_the_page_for_browsers_and_the_ollama_banner_for_others(served):
    html = httpx.get(served.url + "/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/dashboard/app.js">' in html.text
    for accept in (None, "*/*", "application/json"):
        r = httpx.get(served.url + "/", headers={"Accept": accept} if accept else {})
        assert r.status_code == 200 and r.text == "Ollama is running", (accept, r.text[:80])
    assert httpx.head(served.url + "/").status_code == 200
    for asset in ("app.js", "api.js", "chat.js", "dom.js", "model.js", "views.js", "style.css"):
        r = httpx.get(f"{served.url}/dashboard/{asset}")
        assert r.status_code == 200 and r.headers["cache-control"] == "no-cache", asset
    assert httpx.get(served.url + "/dashboard/app.js").headers["content-type"].startswith(("text/javascript", "application/javascript"))
    missing = httpx.get(served.url + "/dashboard/nope.js")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_every_static_file_is_package_data():
    """pyproject's package-data patterns cover every file of the page (else an installed,
    non-editable node would serve 404s)."""
    import fnmatch
    import tomllib

    from exo_p2p.dashboard import STATIC_DIR

    pyproject = tomllib.loads((STATIC_DIR.parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["exo_p2p.dashboard"]
    files = [p.relative_to(STATIC_DIR.parent).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file()]
    assert "static/index.html" in files and "static/app.js" in files
    assert [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)] == []


def test_with_api_key_the_page_and_assets_need_none_but_the_data_does():
    server = ServedBackend(FakeCluster(synthetic_state(8)), access=AccessPolicy.of(["k1"])).start()
    try:
        assert httpx.get(server.url + "/", headers={"Accept": "text/html"}).status_code == 200
        assert httpx.get(server.url + "/").text == "Ollama is running"
        assert httpx.get(server.url + "/dashboard/app.js").status_code == 200
        assert httpx.get(server.url + "/state").status_code == 401
        for sneaky in ("/dashboard/../state", "/dashboard/%2e%2e/state", "/dashboard//state"):
            status, body = raw_get(server.port, sneaky)  # unnormalized, as a hostile client sends it
            assert status in (401, 404), (sneaky, status, body[:200])
            assert b'"nodes"' not in body
        assert httpx.get(server.url + "/state", headers={"Authorization": "Bearer k1"}).status_code == 200
    finally:
        server.close()


def test_eight_nodes_and_four_instances_stay_usable(page, served):
    started, cpu = time.monotonic(), cpu_seconds()
    page.goto(served.url + "/")
    # generous: bounded only so a hang fails; the render's speed is asserted below in CPU time
    page.wait_for_function("document.querySelectorAll('#nodes .node-card').length === 8", timeout=30000)
    first_render, first_render_cpu = time.monotonic() - started, cpu_seconds() - cpu
    assert page.locator("#graph svg .graph-node").count() == 8
    assert page.locator("#graph svg .link").count() == 28
    assert page.locator("#graph svg .link-label").count() == 0  # too many to label: listed instead
    assert page.locator("#links details summary").inner_text() == "28 links"
    assert page.locator("#instances .instance-card").count() == 4
    assert sorted(c.get_attribute("data-status") for c in page.locator("#instances .instance-card").all()) == ["failed", "loading", "ready", "ready"]
    loading = page.locator('#instances .instance-card[data-status="loading"]')
    assert "3/8 layers loaded" in loading.inner_text()
    assert abs(float(loading.locator("progress.load").evaluate("p => p.value")) - 3 / 8) < 1e-9
    assert "requests in flight: 1" in page.locator("#instances").inner_text()
    assert "disk 100 GiB free" in page.locator("#nodes").inner_text()  # the models dir's free disk
    # node cards lie in a grid: no card overlaps another, none leaves the viewport's width
    boxes = [c.bounding_box() for c in page.locator("#nodes .node-card").all()]
    for i, a in enumerate(boxes):
        assert a["x"] + a["width"] <= 1400
        for b in boxes[i + 1:]:
            assert a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"] or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"]
    # a poll of an unchanged State rebuilds nothing (the cards are the same DOM nodes)
    page.evaluate("window.firstCard = document.querySelector('#nodes .node-card')")
    time.sleep(1.2)
    assert page.evaluate("window.firstCard === document.querySelector('#nodes .node-card')")
    # the chat still works beside all this
    page.fill("#chat-input", "why is the sky blue?")
    page.click("#chat-send")
    page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=10000)
    assert page.locator("#chat-log .msg.assistant .content").last.inner_text() == "".join(TOKENS)
    print(f"8 nodes / 4 instances: first render {first_render:.2f} s after navigation, {first_render_cpu:.2f} s of CPU")
    assert first_render_cpu < 3.0, (first_render_cpu, first_render)


def test_failed_instance_shows_why_and_refused_placement_shows_the_masters_reason(page, served):
    page.goto(served.url + "/")
    failed = page.locator('#instances .instance-card[data-status="failed"]')
    failed.wait_for(timeout=WAIT_MS)
    assert FAILURE.split(": ", 1)[1] in failed.locator(".failure").inner_text()
    page.locator(f'#models tr[data-model="{REFUSED_MODEL}"] button.place').click()
    page.locator("#preview button.confirm").first.click()
    error = page.locator("#preview .placement-error")
    error.wait_for(timeout=WAIT_MS)
    assert error.inner_text() == f"The master refused: {REFUSAL}"
    # an impossible preview is shown with its reason, without a Place button
    page.locator("#preview button.close").click()
    page.locator('#models tr[data-model="phi-3"] button.place').click()
    impossible = page.locator("#preview tr.impossible")
    impossible.wait_for(timeout=WAIT_MS)
    assert "tensor split needs" in impossible.inner_text() and impossible.locator("button").count() == 0


def test_delete_from_the_page(page, served):
    page.goto(served.url + "/")
    page.wait_for_function("document.querySelectorAll('#instances .instance-card').length === 4", timeout=WAIT_MS)
    page.locator('#instances .instance-card[data-status="failed"] button.delete').click()
    page.wait_for_function("document.querySelectorAll('#instances .instance-card').length === 3", timeout=WAIT_MS)
    assert len(served.backend.state().instances) == 3


def test_lost_connection_is_shown_and_the_page_reconnects_by_itself(page, served):
    page.goto(served.url + "/")
    page.locator("#nodes .node-card").first.wait_for(timeout=WAIT_MS)
    assert page.locator("#connection").is_hidden()
    page.route("**/state", lambda route: route.abort())
    page.locator("#connection").wait_for(state="visible", timeout=3000)
    assert "Lost the connection" in page.locator("#connection").inner_text()
    assert page.locator("#nodes .node-card").count() == 8  # the last view stays, dimmed
    page.unroute("**/state")
    page.locator("#connection").wait_for(state="hidden", timeout=3000)
    # and a change after reconnecting shows at the next poll: within the page's POLL_MS, plus a
    # slack of 1 s for that poll's fetch and render on a loaded machine
    import re
    from pathlib import Path

    import exo_p2p.dashboard

    app_js = (Path(exo_p2p.dashboard.__file__).parent / "static" / "app.js").read_text()
    poll_s = int(re.search(r"const POLL_MS = (\d+);", app_js).group(1)) / 1000
    victim = next(iter(served.backend.state().instances))
    from exo_p2p.types import InstanceDeleted

    served.call(served.backend._apply, InstanceDeleted(instance_id=victim))
    changed = time.monotonic()
    page.wait_for_function(f"!document.querySelector('[data-instance-id=\"{victim}\"]')", timeout=10000)
    shown_after = time.monotonic() - changed
    assert shown_after < poll_s + 1.0, shown_after


JS_CASES = """
async () => {
  const m = await import('/dashboard/model.js');
  const out = {};
  out.bytes = [m.formatBytes(0), m.formatBytes(1536), m.formatBytes(25276502016), m.formatBytes(null)];
  const state = {
    master: 'n1', node_id: 'n1',
    nodes: {n1: {friendly_name: 'vm', memory_total: 1000, memory_available: 600, models: ['a']},
            n2: {friendly_name: 'vm', memory_total: 1000, memory_available: 900, models: []},
            n3: {friendly_name: 'solo', memory_total: null, memory_available: null}},
    edges: {n1: {n2: {address: '10.0.0.2', interface_type: 'ethernet'}, gone: {address: 'x', interface_type: 'wifi'}},
            n2: {n1: {address: '10.0.0.1', interface_type: 'ethernet'}},
            n3: {n1: {address: '10.0.0.1', interface_type: 'wifi'}}},
    instances: {i1: {model_id: 'a', shards: [{node_id: 'n1', share_bytes: 300}, {node_id: 'n2', share_bytes: 50}]}},
    tasks: {t1: {status: 'running', task: {instance_id: 'i1'}}, t2: {status: 'complete', task: {instance_id: 'i1'}}},
    model_cards: {a: {n_layers: 4, storage_size: 350, context_length: 100}},
  };
  out.labels = m.nodeLabels(state);
  out.mem1 = m.nodeMemory(state, 'n1');
  out.mem3 = m.nodeMemory(state, 'n3');
  out.links = m.topologyLinks(state);
  out.inflight = m.requestsInFlight(state);
  out.models = m.modelRows(state);
  out.order = m.nodeOrder(state);
  out.sse = m.splitSse('data: {"a":1}\\n\\ndata: [DONE]\\n\\ndata: {"b"');
  out.stats = m.answerStats({sentAt: 0, firstAt: 500, lastAt: 2500, tokens: 21});
  out.stats1 = m.answerStats({sentAt: 0, firstAt: 500, lastAt: 500, tokens: 1});
  out.chat = m.chatModels([{status: 'ready', model: 'b'}, {status: 'loading', model: 'c'}, {status: 'ready', model: 'b'}]);
  return out;
}
"""


def test_model_functions_in_the_browser(page, served):
    page.goto(served.url + "/dashboard/index.html")
    out = page.evaluate(JS_CASES)
    assert out["bytes"] == ["0 B", "1.50 KiB", "23.5 GiB", "?"]
    assert out["labels"] == {"n1": "vm n1", "n2": "vm n2", "n3": "solo"}
    assert out["mem1"]["ours"] == 300 and out["mem1"]["other"] == 100 and out["mem1"]["free"] == 600
    assert out["mem1"]["fractions"] == {"ours": 0.3, "other": 0.1, "free": 0.6}
    assert out["mem3"]["fractions"] is None and out["mem3"]["ours"] == 0
    links = {(l["a"], l["b"]): l for l in out["links"]}
    assert set(links) == {("n1", "n2"), ("n1", "n3")}  # the edge to a node not in State is left out
    assert links[("n1", "n2")]["both"] and not links[("n1", "n3")]["both"]
    assert links[("n1", "n2")]["addresses"] == ["10.0.0.2", "10.0.0.1"] and links[("n1", "n2")]["kinds"] == ["ethernet"]
    assert out["inflight"] == {"i1": 1}
    assert out["models"] == [{"id": "a", "n_layers": 4, "storage_size": 350, "context_length": 100, "tasks": ["generate"], "holders": ["n1"], "instances": 1}]
    assert out["order"][0] == "n1"
    assert out["sse"] == {"events": ['{"a":1}', "[DONE]"], "rest": 'data: {"b"'}
    assert out["stats"] == {"ttft": 0.5, "tokensPerSecond": 10.0, "tokens": 21}
    assert out["stats1"]["tokensPerSecond"] is None
    assert out["chat"] == ["b"]
