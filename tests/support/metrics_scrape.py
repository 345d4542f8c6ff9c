"""Serving an API with metrics and reading its Prometheus text."""

from __future__ import annotations

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from exo_p2p.api.access import AccessPolicy
from exo_p2p.api.app import create_app
from exo_p2p.metrics.observer import Observer
from tests.support.fake_master import FakeMaster


KEY = "sk-metrics-0123"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition, by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def _run(body, *, access: AccessPolicy | None = None, client: tuple[str, int] = ("127.0.0.1", 5000),
         observer: Observer | None = None) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = FakeMaster(nursery)
            app = create_app(backend, access=access, observer=observer)
            transport = httpx.ASGITransport(app=app, client=client)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                with trio.fail_after(10):
                    await body(http)
            nursery.cancel_scope.cancel()

    trio.run(main)
