"""A cross-site GET in a real browser (``exo_p2p.api.access`` rule 1b): another site's page
with ``<img src=http://127.0.0.1:PORT/instances/previews?model=…>`` (and a ``<script>`` and a
``<link>`` of the same URL) makes the browser send GETs with no ``Origin``, which a keyless
node would serve (a preview reads a hub repo). Chromium marks them ``Sec-Fetch-Site:
cross-site``; the node refuses them before any route runs, so the backend is never asked. A
direct visit (``Sec-Fetch-Site: none``) is served: the control that the recorder works.

The attacker's page is ``http://evil.test:PORT/`` (Playwright answers it; Chromium resolves
``evil.test`` to 127.0.0.1); Local Network Access is off as in ``test_dashboard_hosts``: the
node must refuse whatever the browser does.
"""

from __future__ import annotations

import pytest

from exo_p2p.api.access import AccessPolicy
from exo_p2p.types import ErrorInfo
from tests.dashboard.fake_backend import FakeCluster, ServedBackend, synthetic_state

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
CHROMIUM_EXTRA_ARGS = ["--host-resolver-rules=MAP evil.test 127.0.0.1", "--disable-features=LocalNetworkAccessChecks"]
WAIT_MS = 30_000


class HubAsked(FakeCluster):
    """A fake backend that records every hub read a route asks for."""

    asked: list[str]

    async def read_from_hub(self, name: str) -> tuple[str, ErrorInfo | None]:
        self.asked.append(name)
        return name, None


def _attack(url: str) -> str:
    return f"""<!doctype html><title>cute cats</title>
<script>window.done = 0;</script>
<img src="{url}&via=img" onerror="window.done++" onload="window.done++">
<script src="{url}&via=script" onerror="window.done++" onload="window.done++"></script>
<link rel="stylesheet" href="{url}&via=link" onerror="window.done++" onload="window.done++">"""


def test_a_cross_site_img_script_or_link_get_never_reaches_a_route(page):
    backend = HubAsked(synthetic_state(8))
    backend.asked = []
    served = ServedBackend(backend, access=AccessPolicy.of([], [], [])).start()
    try:
        target = f"{served.url}/instances/previews?model=org/evil"
        attack_url = f"http://evil.test:{served.port}/cats.html"
        page.route(attack_url, lambda route: route.fulfill(status=200, content_type="text/html", body=_attack(target)))
        page.goto(attack_url)
        page.wait_for_function("window.done === 3", timeout=WAIT_MS)  # all three GETs were answered
        assert backend.asked == []
        direct = page.goto(target)  # typed in the address bar: no other site involved
        assert direct is not None and direct.status == 404  # the fake hub knows no org/evil
        assert backend.asked == ["org/evil"]
    finally:
        served.close()
