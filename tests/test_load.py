"""Load on one instance of a tiny synthetic model."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import psutil
import pytest

from tests.conftest import tiny_models_dir
from tests.support.cluster import NodeProcess, wait_until

pytestmark = pytest.mark.integration
MODEL = "tiny"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=2, seed=3)


def _rss_total(node: NodeProcess) -> int:
    procs = [psutil.Process(node.proc.pid), *node.children()]
    return sum(p.memory_info().rss for p in procs)


def _one(url: str, i: int) -> tuple[int, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"request {i}"}], "max_tokens": 6, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    return r.status_code, r.text


def test_fifty_concurrent_requests_complete_and_leave_nothing_behind(tmp_path, models_dir):
    node = NodeProcess(tmp_path / "n", extra_args=["--models-dir", str(models_dir), "--queue-limit", "64"])
    try:
        node.start()
        node.place_and_wait(MODEL, timeout=60)
        # expected outputs, one request at a time
        expected = {i: _one(node.url, i) for i in range(3)}
        assert all(code == 200 for code, _ in expected.values())
        for _ in range(2):  # settle allocations before measuring
            _one(node.url, 0)
        rss_before = _rss_total(node)
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(50) as pool:
            results = list(pool.map(lambda i: _one(node.url, i), range(50)))
        elapsed = time.monotonic() - t0
        assert [code for code, _ in results] == [200] * 50, [r for r in results if r[0] != 200][:3]
        import json

        for i in range(3):  # outputs under load equal the single-request outputs
            assert json.loads(results[i][1])["choices"][0]["message"]["content"] == json.loads(expected[i][1])["choices"][0]["message"]["content"]
        wait_until(lambda: node.get("/state").json()["tasks"] == {}, 10, what="no task left in State")
        rss_after = _rss_total(node)
        assert rss_after - rss_before < 50 * 1024 * 1024, (rss_before, rss_after)
        assert elapsed < 120
    finally:
        node.stop()


def test_queue_limit_answers_429_at_once_and_the_rest_complete(tmp_path, models_dir):
    node = NodeProcess(tmp_path / "n", extra_args=["--models-dir", str(models_dir), "--queue-limit", "8"])
    try:
        node.start()
        node.place_and_wait(MODEL, timeout=60)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 40, "temperature": 0}

        def call(_):
            t = time.monotonic()
            r = httpx.post(node.url + "/v1/chat/completions", json=body, timeout=120)
            return r.status_code, time.monotonic() - t, r.text

        with cf.ThreadPoolExecutor(20) as pool:
            results = list(pool.map(call, range(20)))
        codes = [c for c, _, _ in results]
        assert codes.count(200) >= 8 and codes.count(429) >= 1, codes
        assert set(codes) <= {200, 429}, results
        for code, took, text in results:
            if code == 429:
                assert "queue" in text and took < 5
        wait_until(lambda: node.get("/state").json()["tasks"] == {}, 10, what="no task left in State")
    finally:
        node.stop()
