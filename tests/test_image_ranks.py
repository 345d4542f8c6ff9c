"""An image model's transformer blocks split over rank processes on the MLX ring
(docs/images.md#pipeline): the pixels equal mflux's own in process, for a generation with
partial images and for an edit, on 2 and 3 ranks and at every cut of the tiny model's blocks;
a request the leader cannot begin ends with an error on every rank, not a hang."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import free_ports
from tests.support.image_oracle import oracle_edit_png, oracle_png, pixels, reference_png, tiny_checkpoint
from tests.support.ranks import child_main, ring_wait_for, run_rank_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

RANK_TIMEOUT = 300.0
"""Seconds for every rank of one run together (load, ring, a few tiny images; loaded machine)."""

GEN = {"prompt": "a red fox", "width": 64, "height": 48, "steps": 3, "seed": 7, "partial_images": 1}
EDIT = {"prompt": "make it blue", "width": 64, "height": 48, "steps": 2, "seed": 5}


def rank_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank: load its share, join the ring, run the requests through ``ImageWork``."""
    from exo_p2p.types import ErrorChunk, FinishChunk, ImageChunk, ImageEdits, ImageGeneration, ImageParams
    from worker.engine.distributed import init_ring
    from worker.image.engine import run_maker
    from worker.image.load import load_progress
    from worker.image.ranks import RankPipeline
    from worker.image.stages import Stage
    from worker.image.work import ImageWork

    rank, start, end = cfg["rank"], cfg["start"], cfg["end"]
    out: list[Any] = []
    for _ in load_progress(cfg["model_dir"], out, span=(start, end), leader=rank == 0):
        pass
    pipeline = out[0]
    group = init_ring(cfg["addresses"], rank, len(cfg["addresses"]), timeout=60)
    wait = ring_wait_for(cfg["addresses"], rank)  # asleep between turns, as the runner's ranks
    work = ImageWork(run_maker(pipeline, RankPipeline(Stage(pipeline.transformer, start, end), group, wait)))
    results = []
    for i, req in enumerate(cfg["requests"]):
        params = dict(req["params"])
        if req.get("reference"):
            params["image"] = bytes.fromhex(req["reference"])
        kind = ImageEdits if req.get("reference") else ImageGeneration
        work.submit(kind(task_id=f"t{i}", instance_id="i", model_id="tiny", params=ImageParams(**params), api_node_id="n"))
        chunks: list[Any] = []
        for _ in range(100):
            chunks += work.step()
            if chunks and isinstance(chunks[-1], (FinishChunk, ErrorChunk)):
                break
        results.append({"images": [c.image.hex() for c in chunks if isinstance(c, ImageChunk)],
                        "partial": [c.partial for c in chunks if isinstance(c, ImageChunk)],
                        "end": type(chunks[-1]).__name__,
                        "error": chunks[-1].error.message if isinstance(chunks[-1], ErrorChunk) else None})
    blocks = sum(1 for b in list(pipeline.transformer.transformer_blocks) + list(pipeline.transformer.single_transformer_blocks)
                 if b.parameters())
    return {"rank": rank, "results": results, "blocks_held": blocks,
            "text_encoder": bool(pipeline.text_encoder.parameters()), "vae": bool(pipeline.vae.parameters())}


def run_ranks(model_dir: Path, spans: list[tuple[int, int]], requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    addresses = [f"127.0.0.1:{p}" for p in free_ports(len(spans))]
    cfgs = [{"model_dir": str(model_dir), "rank": r, "start": s, "end": e, "addresses": addresses,
             "requests": requests} for r, (s, e) in enumerate(spans)]
    return run_rank_processes("tests.test_image_ranks", cfgs, RANK_TIMEOUT)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def oracle(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    size = {k: v for k, v in GEN.items() if k != "partial_images"}
    return {"gen": pixels(oracle_png(ckpt, **size)),
            "edit": pixels(oracle_edit_png(ckpt, reference_png(), tmp=tmp_path_factory.mktemp("ref"), **EDIT))}


@pytest.mark.parametrize("spans", [[(0, 2), (2, 4)], [(0, 1), (1, 4)], [(0, 3), (3, 4)], [(0, 1), (1, 3), (3, 4)]],
                         ids=["2-ranks-at-single", "2-ranks-in-double", "2-ranks-in-single", "3-ranks"])
def test_pipeline_pixels_equal_mflux(ckpt: Path, oracle: dict[str, bytes], spans) -> None:
    """Generation (with a partial image) and edit on a pipeline equal mflux's whole model."""
    reqs = [{"params": GEN}, {"params": EDIT, "reference": reference_png().hex()}]
    ranks = run_ranks(ckpt, spans, reqs)
    leader = ranks[0]["results"]
    assert leader[0]["partial"] == [True, False] and leader[0]["end"] == "FinishChunk"
    assert pixels(bytes.fromhex(leader[0]["images"][-1])) == oracle["gen"]
    assert pixels(bytes.fromhex(leader[1]["images"][-1])) == oracle["edit"]
    for r, (start, end) in zip(ranks, spans, strict=True):
        assert r["blocks_held"] == end - start  # each rank holds only its blocks
        assert r["text_encoder"] == r["vae"] == (r["rank"] == 0)  # encoder and VAE on the leader only
        if r["rank"] > 0:
            assert [x["end"] for x in r["results"]] == ["FinishChunk"] * 2 and not any(x["images"] for x in r["results"])


def test_leader_failure_ends_the_task_on_every_rank(ckpt: Path) -> None:
    """An edit whose reference the leader cannot read: an error on both ranks, then the next
    request on the same ring still equals mflux (the ranks stayed in step)."""
    reqs = [{"params": EDIT, "reference": b"not an image".hex()}, {"params": GEN}]
    ranks = run_ranks(ckpt, [(0, 2), (2, 4)], reqs)
    for r in ranks:
        assert r["results"][0]["end"] == "ErrorChunk", json.dumps(r["results"][0])[:300]
        assert r["results"][1]["end"] == "FinishChunk"
    size = {k: v for k, v in GEN.items() if k != "partial_images"}
    assert pixels(bytes.fromhex(ranks[0]["results"][1]["images"][-1])) == pixels(oracle_png(ckpt, **size))


if __name__ == "__main__":
    child_main(rank_main)
