"""The embedded SmolLM2 embeds end to end (docs/api.md#embeddings-and-reranking): the ``openai``
client's vectors from a node serving it equal its last token's final hidden state computed
in-process by mlx-lm on the same weights (the GGUF imported the way the node imports it)."""

from __future__ import annotations

import numpy as np
import pytest

from exo_p2p.embeddings.vectors import cosine, normalize
from tests.conftest import EMBEDDED_MODEL

pytestmark = pytest.mark.e2e
openai = pytest.importorskip("openai")

TEXTS = ["The capital of France is Paris.", "Embeddings map text to vectors.", "hello"]


def test_the_embedded_model_embeds_as_mlx_lm_computes(embedded_node, tmp_path) -> None:
    import mlx.core as mx
    from mlx_lm.utils import load

    from exo_p2p.models.stores.embedded import find_embedded_gguf
    from exo_p2p.models.gguf.importer import import_gguf

    client = openai.OpenAI(base_url=f"{embedded_node.url}/v1", api_key="unused", max_retries=0, timeout=300)
    got = client.embeddings.create(model=EMBEDDED_MODEL, input=TEXTS)
    assert [d.index for d in got.data] == [0, 1, 2] and got.usage.prompt_tokens > len(TEXTS)
    model, tok = load(str(import_gguf(find_embedded_gguf(), tmp_path / "smollm2")))
    for text, d in zip(TEXTS, got.data):
        hidden = np.array(model.model(mx.array([tok.encode(text)])).astype(mx.float32))[0]
        expected = normalize(hidden[-1][None])[0]
        assert len(d.embedding) == expected.shape[0] == 576
        distance = 1 - float(cosine(np.array(d.embedding, dtype=np.float32), expected[None])[0])
        assert distance <= 1e-5
