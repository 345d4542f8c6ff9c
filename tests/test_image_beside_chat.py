"""An image and 8 chat streams on one 2-node cluster (docs/images.md#beside-chat): the image
model placed on node A, the text model on node B; both finish, and chat keeps
``KEPT_RATE`` of its decode rate while the image runs.

"Another node" is another machine; here both nodes share this machine's cores, so each node
(and the runners it starts, which inherit it) is pinned to its own core (``taskset``-style
affinity): without that the image runner takes half of the chat runner's cores and the bound
would measure the machine, not the cluster. The rate alone is measured before and after the
rate beside the image, and the bound is taken against the slower of the two: other work on
the machine (the suite's other workers) moves the rate alone by up to 2× within one test (405
and 840 tok/s in one CI run), so the slower run is the rate without the image under the
heaviest load the test saw.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import httpx
import pytest

from tests.support.cluster import NodeProcess, converged, nodes_cleanup, state_of, wait_until
from tests.support.image_oracle import tiny_checkpoint
from tests.support.models.synthetic_models import make_synthetic_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

IMAGE, TEXT, STREAMS, TOKENS = "tiny-flux2", "tiny-text", 8, 200
KEPT_RATE = 0.4
"""Chat's decode rate beside the image over its slower rate alone that this test asserts. The
issue's target is 0.8 with the nodes on separate machines; here both nodes share one 2-vCPU
host, every thread of each node and its runners pinned to its own core and the chat's clients
to the chat's core: alone on the machine the chat kept 1.17 and 0.94 (docs/images.md#beside-chat).
Under the suite's other workers (not pinned) the image's load pushes theirs onto the chat's
core (0.51 seen before every thread was pinned), so the test asserts what the cluster owes
whatever the host: an image's chunks, events or a blocked loop must not starve the chat
(which gives ~0)."""


def _chat(node: NodeProcess, i: int, out: list) -> None:
    body = {"model": TEXT, "messages": [{"role": "user", "content": f"story {i}"}], "max_tokens": TOKENS,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    first = last = None
    tokens = 0
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            if any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                first, last = first or time.monotonic(), time.monotonic()
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    out.append((first, last, tokens))


def decode_rate(node: NodeProcess) -> float:
    """Tokens per second of ``STREAMS`` greedy chat streams at once (all their tokens after
    the first over the span from the first first token to the last token)."""
    out: list = []
    threads = [threading.Thread(target=_chat, args=(node, i, out), daemon=True) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(out) == STREAMS and all(f is not None and n == TOKENS for f, _, n in out), out
    span = max(last for _, last, _ in out) - min(first for first, _, _ in out)
    return sum(n - 1 for _, _, n in out) / span


def _pinned(node: NodeProcess, core: int) -> NodeProcess:
    node.start()
    _pin_tree(node.proc.pid, core)
    return node


@pytest.fixture(autouse=True)
def _restore_affinity():  # type: ignore[no-untyped-def]
    """The test pins its own main thread to the chat's core; the next test gets it back."""
    cores = os.sched_getaffinity(0)
    yield
    os.sched_setaffinity(0, cores)


def _pin_tree(pid: int, core: int) -> None:
    """Pin every thread of process ``pid`` and of its descendants to ``core``: affinity is per
    thread, and a process spawned from a thread that was never pinned (the node starts its
    runners from worker threads) would not inherit the main thread's."""
    import psutil

    root = psutil.Process(pid)
    for proc in (root, *root.children(recursive=True)):
        try:
            for thread in proc.threads():
                os.sched_setaffinity(thread.id, {core})
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores: one per node")
def test_chat_keeps_its_rate_while_an_image_runs_on_the_other_node(tmp_path, tmp_path_factory) -> None:
    image_dir, text_dir = tmp_path / "image-models", tmp_path / "text-models"
    shutil.copytree(tiny_checkpoint(tmp_path_factory), image_dir / IMAGE)
    make_synthetic_model(text_dir / TEXT, n_layers=4, hidden_size=256, intermediate_size=512, seed=3)
    a = NodeProcess(tmp_path / "a", extra_args=["--models-dir", str(image_dir)], env={"OPENBLAS_NUM_THREADS": "1"})
    nodes = [a]
    with nodes_cleanup(nodes):
        _pinned(a, 0)
        boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
        b = NodeProcess(tmp_path / "b", cluster=a.cluster, extra_args=["--models-dir", str(text_dir), *boot],
                        env={"OPENBLAS_NUM_THREADS": "1"})
        nodes.append(b)
        _pinned(b, 1)
        wait_until(lambda: converged(nodes, 2), 60, what="2-node cluster")
        for model, holder in ((IMAGE, a), (TEXT, b)):
            r = a.post("/instances", json={"model": model, "nodes": [state_of(holder)["node_id"]]})
            assert r.status_code == 201, r.text
            iid = r.json()["instance_id"]
            wait_until(lambda: a.get(f"/instances/{iid}").json()["status"] == "ready", 300, what=f"{model} ready")
        _pin_tree(a.proc.pid, 0)  # again, now with the runners started
        _pin_tree(b.proc.pid, 1)
        os.sched_setaffinity(0, {1})  # the chat's clients (threads made from here inherit it) beside the chat's node
        decode_rate(b)  # untimed: the first batch of 8 rows warms the text runner up
        alone = [decode_rate(b)]  # chat asked of the text node's API, the image of the image node's
        image: dict = {"steps": []}

        def draw() -> None:
            body = {"model": IMAGE, "prompt": "a lighthouse", "size": "256x256", "steps": 50, "seed": 1,
                    "stream": True, "progress": True}
            with httpx.stream("POST", a.url + "/v1/images/generations", json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        image["steps"].append((time.monotonic(), event.get("step")))
                        image["last"] = event["type"]

        drawing = threading.Thread(target=draw, daemon=True)
        drawing.start()
        wait_until(lambda: len(image["steps"]) >= 2, 300, what="the image's first steps")
        beside = decode_rate(b)
        still_drawing = image.get("last") == "image_generation.progress"
        drawing.join(600)
        alone.append(decode_rate(b))
    assert image.get("last") == "image_generation.completed", image.get("last")
    assert still_drawing, "the image ended before the chat streams did: they did not run beside it"
    ratio = beside / min(alone)
    print(f"chat decode rate: alone {alone[0]:.1f} / {alone[1]:.1f} tok/s, beside the image {beside:.1f} tok/s, "
          f"kept {ratio:.2f}; load average {os.getloadavg()[0]:.1f}")
    assert ratio >= KEPT_RATE, (alone, beside)
