"""Speculative decoding across ranks: two pipeline ranks (the ``1 + K`` positions travel the
ring once) and two tensor ranks give, token for token, the text of the same requests on one
node with speculation off; the drafts are proposed on every rank from the agreed tokens alone.

The model is the "echoing" tiny model of ``tests/test_spec.py`` written to disk (its layers'
residual contributions scaled to 0.15), so rows' drafts are partly accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from tests.support.batch_drive import drive, user
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.chunks import TokenChunk
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.tasks import GenerationParams
from worker.engine.builder import build_engine
from worker.engine.loading.loader import load_all

pytestmark = pytest.mark.integration


def echo_model(out: Path, factor: float = 0.15) -> Path:
    """A tiny synthetic model on disk whose layers' residual contributions are scaled by ``factor``."""
    model_dir = make_synthetic_model(out, n_layers=4)
    for path in model_dir.glob("*.safetensors"):
        weights = mx.load(str(path))
        scaled = {k: (v * factor if k.endswith(("o_proj.weight", "down_proj.weight")) else v) for k, v in weights.items()}
        mx.save_safetensors(str(path), scaled, metadata={"format": "mlx"})
    return model_dir


def reqs() -> list[tuple[str, GenerationParams]]:
    out = [(f"e{i}", GenerationParams(messages=user(f"a b c {i} a b c {i} " * (i + 2)), max_tokens=40 + 9 * i,
                                      temperature=0.0)) for i in range(4)]
    out.append(("s", GenerationParams(messages=user("sampled"), max_tokens=30, temperature=0.8, seed=7)))
    out.append(("stop", GenerationParams(messages=user("a b a b a b"), max_tokens=50, temperature=0.0, stop=("e",))))
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return echo_model(tmp_path_factory.mktemp("specranks") / "echo")


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> dict[str, Any]:
    """The requests on one node, speculation off; and with it on, how many drafts were accepted."""
    loaded = load_all(model_dir)
    out = {}
    for spec in ("off", "ngram"):
        gen = build_engine(loaded, EngineSettings(prefill_chunk_size=16, max_batch=16, speculative=spec))
        for task_id, params in reqs():
            gen.submit(task_id, params)
        out[spec] = drive(gen)
        out[f"{spec}-stats"] = gen.batch.spec
    return out


@pytest.mark.parametrize("sharding", ["pipeline", "tensor"])
def test_ranks_with_speculation_equal_one_node_without(model_dir: Path, reference: dict[str, Any], sharding: str) -> None:
    from tests.support.runners import bring_up, deliver, shut_down_cleanly, start_runners, task_for_request, tensor_runners, wait_for

    stats = reference["ngram-stats"].stats
    assert 0 < stats.accepted < stats.proposed  # the same tokens draft the same way on the ranks
    assert reference["ngram"]["ids"] == reference["off"]["ids"]
    tasks = [task_for_request(i, r) for i, r in enumerate(reqs())]
    runners = (tensor_runners(model_dir, 16, speculative="ngram") if sharding == "tensor"
               else start_runners(model_dir, 2, max_batch=16, speculative="ngram"))
    try:
        bring_up(runners)
        deliver(runners, tasks)
        for t in tasks:
            wait_for(lambda t=t: all("complete" in r.task_status(t.task_id) for r in runners), 90, f"{t.task_id} complete")
        for t in tasks:
            text = "".join(c.text for c in runners[0].chunks(t.task_id) if isinstance(c, TokenChunk))
            assert text == reference["off"]["texts"].get(t.task_id, ""), t.task_id
        shut_down_cleanly(runners)
    finally:
        for r in runners:
            r.close()
