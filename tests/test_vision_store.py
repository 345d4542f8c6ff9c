"""The image bytes' path: the API node's store is bounded in entries, bytes and time; the peer
protocol's server refuses malformed digests and images it does not hold; the fetching side
keeps only bytes whose sha256 is the digest asked for; a task's images reach its runner
before the task, and a task whose image is not available still goes (the runner ends it)."""

from __future__ import annotations

import hashlib

import pytest
import trio

from exo_p2p.types import ChatMessage, GenerationParams, ImageRef, TextGeneration
from exo_p2p.vision.peer import image_bytes, serve_image
from exo_p2p.vision.store import ImageStore
from worker.runner.protocol import ImageData
from worker.vision.delivery import forward_work, task_digests

pytestmark = pytest.mark.unit


def test_the_store_is_bounded_in_entries_bytes_and_time() -> None:
    now = [0.0]
    store = ImageStore(max_entries=2, max_bytes=10, ttl=5.0, clock=lambda: now[0])
    store.put("a", b"1234")
    store.put("b", b"1234")
    store.put("c", b"12")
    assert (store.get("a"), len(store)) == (None, 2)  # the oldest out past two entries
    store.put("d", b"12345678")
    assert store.get("b") is None and store.nbytes <= 10
    store.put("huge", b"x" * 11)
    assert store.get("huge") is None  # larger than the store alone: not kept
    now[0] = 4.0
    assert store.get("d") == b"12345678"  # read: its time renewed
    now[0] = 8.0
    assert store.get("d") == b"12345678" and store.get("c") is None  # c expired, d read at 4
    now[0] = 20.0
    assert len(store) == 0 and store.nbytes == 0


def test_the_peer_server_refuses_bad_digests_and_images_not_held() -> None:
    store = ImageStore()
    data = b"image bytes"
    digest = hashlib.sha256(data).hexdigest()
    store.put(digest, data)
    assert trio.run(serve_image, store, "peer", digest.encode()) == data
    with pytest.raises(ValueError, match="64 lowercase hex"):
        trio.run(serve_image, store, "peer", b"../../etc/passwd")
    with pytest.raises(ValueError, match="not held here"):
        trio.run(serve_image, store, "peer", ("0" * 64).encode())


class _Net:
    def __init__(self, reply: bytes | Exception) -> None:
        self.reply, self.asked = reply, []

    async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        self.asked.append((peer, data))
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


def test_the_fetching_side_keeps_only_the_bytes_of_the_digest_asked() -> None:
    data = b"the real image"
    digest = hashlib.sha256(data).hexdigest()
    store = ImageStore()
    assert trio.run(image_bytes, _Net(b"other bytes"), "me", "api", digest, store) is None
    assert trio.run(image_bytes, _Net(RuntimeError("unreachable")), "me", "api", digest, store) is None
    net = _Net(data)
    assert trio.run(image_bytes, net, "me", "api", digest, store) == data and net.asked == [("api", digest.encode())]
    assert trio.run(image_bytes, _Net(RuntimeError("not asked again")), "me", "api", digest, store) == data
    assert trio.run(image_bytes, _Net(data), "me", "me", "f" * 64, store) is None  # the API node is us: no request


class _Supervisor:
    def __init__(self, rank: int = 0) -> None:
        self.shard = type("Shard", (), {"rank": rank})()
        self.sent: set[str] = set()
        self.frames: list[object] = []

    async def send(self, task: object, key: str) -> None:
        self.sent.add(key)
        self.frames.append(task)


def _task(*digests: str) -> TextGeneration:
    refs = tuple(ImageRef(digest=d, media_type="image/png", width=1, height=1, size=1) for d in digests)
    return TextGeneration("t1", "i", "m", GenerationParams(messages=(ChatMessage("user", "?", images=refs),)), "api")  # type: ignore[arg-type]


def test_a_tasks_images_go_before_it_and_a_missing_one_does_not_hold_it() -> None:
    assert task_digests(_task("a", "b", "a")) == ["a", "b"]
    held = {"a": b"A"}

    async def fetch(api: str, digest: str) -> bytes | None:
        return held.get(digest)

    async def main(rank: int) -> _Supervisor:
        sup = _Supervisor(rank)
        async with trio.open_nursery() as nursery:
            await forward_work(sup, _task("a", "b"), fetch, nursery)
            assert "t1" in sup.sent  # marked sent at once: the plan does not forward it twice
        return sup

    assert [type(f) for f in trio.run(main, 1).frames] == [ImageData, TextGeneration]  # every rank runs the processor
    sup = trio.run(main, 0)
    assert sup.frames[:1] == [ImageData(digest="a", data=b"A")] and isinstance(sup.frames[-1], TextGeneration)
    assert len(sup.frames) == 2  # "b" not available: not sent, the runner ends the task (image_unavailable)


def test_the_store_stays_consistent_under_threads() -> None:
    import threading

    store = ImageStore(max_entries=8, max_bytes=64)

    def hammer(seed: int) -> None:
        for i in range(2000):
            store.put(f"{seed}-{i % 13}", b"x" * (i % 9 + 1))
            store.get(f"{(seed + 1) % 4}-{i % 13}")

    threads = [threading.Thread(target=hammer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    held = [store.get(f"{s}-{i}") for s in range(4) for i in range(13)]
    assert len(store) <= 8 and store.nbytes == sum(len(h) for h in held if h is not None) <= 64
