"""Details of the dashboard's cluster panel against the real API app over a small synthetic
State (no cluster): the node card's free disk stays visible on narrow cards (1024 and 1280 px
wide pages), a link whose node said no interface kind is labelled by what its address tells
(loopback, LAN, internet), "other" memory is explained (and names the other nodes on the same
machine), "Forget API key" shows only while the page uses a key, and a download says how much
came from peers and from a hub (under the instance's bar, in a preview)."""

from __future__ import annotations

import pytest

from exo_p2p.api.access import AccessPolicy
from exo_p2p.types import Instance, NodeId, RunnerDownloading, RunnerRecord, ShardMetadata, State
from exo_p2p.types.topology import NetworkAddress, NodeProfile, TopologyEdge
from tests.dashboard.fake_backend import GiB, FakeCluster, ServedBackend, card

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
WAIT_MS = 30_000
"""Milliseconds a wait for the page to show something may take: bounded only so a hang fails."""
KEY = "details-key"
A, B, C = NodeId("12D3KooWAlphaAlphaAlphaAlphaAlpha1"), NodeId("12D3KooWBetaBetaBetaBetaBetaBeta22"), NodeId("12D3KooWGammaGammaGammaGammaGamma3")
LINKS = {(A, B): "127.0.0.1", (A, C): "192.168.1.7", (B, C): "203.0.113.5"}
"""The address each pair's edges carry, none with an interface kind ("other", as a node
records them today): a, b on one machine, c on the LAN from a and over the internet from b."""


def details_state() -> State:
    """Three nodes with the long CPU and OS strings real machines report; a and b on one
    machine (the same memory figures, a loopback link)."""
    def profile(nid: NodeId, name: str, i: int, available: int) -> NodeProfile:
        return NodeProfile(node_id=nid, boot_id=f"boot-{i}", friendly_name=name, memory_total=31 * GiB + 123 * 2**20,
                           memory_available=available, cpu="Intel(R) Core(TM) i7-10700 CPU @ 2.90GHz", cpu_count=16,
                           os="Linux 6.18.44-fc-v1098-generic", addrs=(NetworkAddress(f"/ip4/127.0.0.1/tcp/{5000 + i}", "127.0.0.1"),),
                           models=("phi-3",), models_disk_free=(123 + i) * GiB)

    nodes = {A: profile(A, "workstation", 0, 17 * GiB), B: profile(B, "workstation", 1, 17 * GiB), C: profile(C, "laptop", 2, 9 * GiB)}
    edges: dict = {A: {}, B: {}, C: {}}
    for (x, y), address in LINKS.items():
        edges[x][y] = TopologyEdge(x, y, address)
        edges[y][x] = TopologyEdge(y, x, address)
    return State(nodes=nodes, edges=edges, model_cards={"phi-3": card("phi-3", 3 * GiB, 8)}, master=A, term=1, last_event_idx=9)


@pytest.fixture
def served():
    server = ServedBackend(FakeCluster(details_state())).start()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("width", [1024, 1280])
def test_free_disk_stays_visible_on_a_narrow_card(browser, served, width):
    context = browser.new_context(viewport={"width": width, "height": 800})
    try:
        page = context.new_page()
        page.goto(served.url + "/")
        page.wait_for_function("document.querySelectorAll('#nodes .node-card').length === 3", timeout=WAIT_MS)
        for i, nid in enumerate((A, B, C)):
            node_card = page.locator(f'#nodes .node-card[data-node-id="{nid}"]')
            facts = node_card.locator(".node-facts")
            disk = facts.locator(".disk-free")
            assert disk.inner_text() == f"disk {123 + i} GiB free"
            assert disk.is_visible()
            # nothing of the line is cut off: no overflow, the text inside the card's box, on top
            assert facts.evaluate("e => e.scrollWidth <= e.clientWidth && e.scrollHeight <= e.clientHeight"), facts.inner_text()
            d, c = disk.bounding_box(), node_card.bounding_box()
            assert c["x"] <= d["x"] and d["x"] + d["width"] <= c["x"] + c["width"], (d, c)
            assert disk.evaluate("e => { const r = e.getBoundingClientRect(); "
                                 "return e.contains(document.elementFromPoint(r.x + r.width - 2, r.y + r.height / 2)); }")
    finally:
        context.close()


def test_a_link_without_an_interface_kind_says_what_its_address_is(page, served):
    page.goto(served.url + "/")
    page.wait_for_function("document.querySelectorAll('#graph svg .link-label').length === 3", timeout=WAIT_MS)
    labels = sorted(page.locator("#graph svg .link-label").all_text_contents())
    assert labels == ["LAN · 192.168.1.7", "internet · 203.0.113.5", "loopback · 127.0.0.1"]
    # readable: no link label overlaps another label of the graph
    texts = page.locator("#graph svg text.link-label, #graph svg text.node-label, #graph svg text.node-sub").all()
    boxes = [(t.text_content(), t.bounding_box()) for t in texts]
    for i, (name, a) in enumerate(boxes):
        for other, b in boxes[i + 1:]:
            apart = a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"] or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"]
            assert apart or " · " not in name + other, (name, other)
    kinds = page.evaluate("""async () => {
      const m = await import('/dashboard/model.js');
      const kind = (address, interface_type = 'other') => m.linkKind({address, interface_type});
      return [kind('127.0.0.1'), kind('::1'), kind('10.2.0.1'), kind('172.16.5.5'), kind('172.32.0.1'),
              kind('fe80::1'), kind('fd00::2'), kind('100.64.0.1'), kind('8.8.8.8'), kind(''), kind('10.0.0.1', 'ethernet')];
    }""")
    assert kinds == ["loopback", "loopback", "LAN", "LAN", "internet", "LAN", "LAN", "LAN", "internet", "other", "ethernet"]


def test_other_memory_is_explained_and_names_the_nodes_on_the_same_machine(page, served):
    page.goto(served.url + "/")
    page.wait_for_function("document.querySelectorAll('#nodes .node-card').length === 3", timeout=WAIT_MS)
    for nid in (A, B, C):
        other = page.locator(f'#nodes .node-card[data-node-id="{nid}"] .mem-legend .other-memory')
        assert other.inner_text().startswith("other ")
        assert "other processes on this machine" in other.get_attribute("title")
        assert "other nodes" in other.get_attribute("title")
    # a and b share a machine (the loopback link): each card says the other's use is in "other"
    note_a = page.locator(f'#nodes .node-card[data-node-id="{A}"] .mem-note').inner_text()
    note_b = page.locator(f'#nodes .node-card[data-node-id="{B}"] .mem-note').inner_text()
    assert note_a.startswith(f"other includes workstation …{B[-6:]}") and "on this machine" in note_a, note_a
    assert note_b.startswith(f"other includes workstation …{A[-6:]}"), note_b
    assert page.locator(f'#nodes .node-card[data-node-id="{C}"] .mem-note').count() == 0


def test_forget_api_key_shows_only_while_a_key_is_in_use(browser, served):
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(served.url + "/")  # a node without --api-key: no key in use
        page.locator("#nodes .node-card").first.wait_for(timeout=WAIT_MS)
        assert page.locator("#forget-key").is_hidden()
    finally:
        context.close()
    keyed = ServedBackend(FakeCluster(details_state()), access=AccessPolicy.of([KEY])).start()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(keyed.url + "/")
        page.locator("#key-dialog").wait_for(state="visible", timeout=WAIT_MS)
        assert page.locator("#forget-key").is_hidden()
        page.fill("#key-input", KEY)
        page.click("#key-submit")
        page.locator("#nodes .node-card").first.wait_for(timeout=WAIT_MS)
        page.locator("#forget-key").wait_for(state="visible", timeout=WAIT_MS)
        page.click("#forget-key")  # forgets the key and reloads: the page asks again
        page.locator("#key-dialog").wait_for(state="visible", timeout=WAIT_MS)
        assert page.locator("#forget-key").is_hidden()
        assert page.evaluate("localStorage.getItem('exo-p2p.api-key')") is None
    finally:
        context.close()
        keyed.close()


def test_a_download_says_how_much_came_from_peers_and_from_the_hub(page):
    """An instance whose rank downloads shows the bytes received from peers and from the hub
    under its bar, and a preview's node that fetches from both says so."""
    import msgspec

    shard = ShardMetadata(node_id=C, runner_id="i-r0", rank=0, world_size=1, start_layer=0, end_layer=8, n_layers=8,
                          share_bytes=3 * GiB, boot_id="boot-2")
    status = RunnerDownloading(GiB, 3 * GiB, 2.0**20, GiB // 4, 3 * GiB // 4)
    state = msgspec.structs.replace(details_state(), instances={"i": Instance("i", "phi-3", "pipeline", (shard,))},
                                    runners={"i-r0": RunnerRecord("i-r0", "i", C, status)})
    server = ServedBackend(FakeCluster(state)).start()
    try:
        page.goto(server.url + "/")
        text = page.locator(".instance-card .progress-text")
        text.wait_for(timeout=WAIT_MS)
        assert text.text_content() == "1.00 GiB/3.00 GiB of shards downloaded (256 MiB from peers, 768 MiB from the hub)", \
            text.text_content()
        panel = page.evaluate("""async () => {
          const v = await import('/dashboard/views.js');
          const p = {sharding: 'pipeline', world_size: 2, nodes: ['a', 'b'], layers: [4, 4], bytes: [1, 1],
                     fetch_bytes: [4194304, 3145728], fetch_from_peers: [0, 1048576], fetch_from_hub: [4194304, 2097152]};
          return v.previewPanel({nodes: {}}, {model: 'm', previews: [p]}, () => {}, () => {}).querySelector('.fetch').textContent;
        }""")
        assert panel == " (fetches 4.00 MiB from the hub + 3.00 MiB (1.00 MiB from peers, 2.00 MiB from the hub))", panel
    finally:
        server.close()
