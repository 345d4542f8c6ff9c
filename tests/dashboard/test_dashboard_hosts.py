"""The ``Host`` rule in a real browser (``exo_p2p.api.hosts``): a DNS-rebinding page reads
nothing, and a node reached by a name given to ``--allowed-hosts`` serves its dashboard.

Chromium resolves ``evil.test`` and ``box.test`` to 127.0.0.1 (``--host-resolver-rules``), the
API's address. The rebinding page is the attacker's: Playwright answers its URL with the
attacker's HTML, as the attacker's server did before the name was re-pointed, while every
request its script makes goes to the network, i.e. to the node, as *same-origin* requests (no
CORS, no ``Origin`` on a GET) carrying ``Host: evil.test:PORT``.

Local Network Access (Chromium asks the user before a page of a public address reaches a
local one) is turned off: it would block the rebound page's requests in the browser when the
page comes from Playwright instead of an address, and the node must refuse them whatever the
browser does (other browsers, or a user who clicks Allow).
"""

from __future__ import annotations

import pytest

from exo_p2p.api.access import AccessPolicy
from tests.dashboard.fake_backend import FakeCluster, ServedBackend, synthetic_state

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
CHROMIUM_EXTRA_ARGS = [
    "--host-resolver-rules=MAP evil.test 127.0.0.1,MAP box.test 127.0.0.1",
    "--disable-features=LocalNetworkAccessChecks",
]
WAIT_MS = 30_000
ATTACK = """<!doctype html><title>cute cats</title><script>
async function steal() {
  const out = {};
  for (const path of ['/state', '/instances', '/nodes', '/v1/models', '/health', '/']) {
    const r = await fetch(path);  // same-origin: http://evil.test:PORT, i.e. the node
    out[path] = [r.status, await r.text()];
  }
  const placed = await fetch('/instances', {method: 'POST', headers: {'content-type': 'application/json'},
                                            body: JSON.stringify({model: 'llama-8b'})});
  out['POST /instances'] = [placed.status, await placed.text()];
  return out;
}
</script>"""


@pytest.fixture
def served():
    server = ServedBackend(FakeCluster(synthetic_state(8)), access=AccessPolicy.of([], [], ["box.test"])).start()
    try:
        yield server
    finally:
        server.close()


def test_a_rebound_page_reads_nothing_and_changes_nothing(page, served):
    attack_url = f"http://evil.test:{served.port}/cats.html"
    page.route(attack_url, lambda route: route.fulfill(status=200, content_type="text/html", body=ATTACK))
    page.goto(attack_url)
    before = len(served.backend.state().instances)
    stolen = page.evaluate("steal()")
    for what, (status, text) in stolen.items():
        assert status == 403, (what, status, text[:300])
        assert "node-0" not in text and "box-0" not in text, what  # no node id, no node name
        assert "--allowed-hosts evil.test" in text, (what, text[:300])
    assert len(served.backend.state().instances) == before


def test_the_dashboard_by_an_allowed_name_works_and_by_another_says_which_flag(page, served):
    page.goto(f"http://box.test:{served.port}/")
    page.wait_for_function("document.querySelectorAll('#nodes .node-card').length === 8", timeout=WAIT_MS)
    page.wait_for_function("document.querySelectorAll('#instances .instance-card').length === 4", timeout=WAIT_MS)
    # a write from the page (Origin http://box.test:PORT) is the API's own page's
    page.locator('#instances .instance-card[data-status="failed"] button.delete').click()
    page.wait_for_function("document.querySelectorAll('#instances .instance-card').length === 3", timeout=WAIT_MS)
    assert len(served.backend.state().instances) == 3
    refused = page.goto(f"http://evil.test:{served.port}/")
    assert refused is not None and refused.status == 403
    assert "start the node with --allowed-hosts evil.test" in page.content()
