"""An image asked on one node and read by a runner on another: the runner's node fetches the
bytes from the API node over the image protocol (the log carries digests only); the answer
equals mlx-vlm's own greedy ``generate`` in this process. Then the model as a 2-node pipeline
(the tower on rank 0, hidden states to rank 1): the same answer through either node's API,
and a second turn re-sending the image reuses the prompt cache on both ranks."""

from __future__ import annotations

import httpx
import pytest

from tests.support.cluster import Cluster, self_id, wait_until
from tests.support.images.samples import data_url, image_bytes
from tests.support.models.synthetic_vlm import make_synthetic_vlm
from tests.support.images.vlm_oracle import QUESTION, vlm_answer

pytestmark = pytest.mark.integration
openai = pytest.importorskip("openai")
MODEL, MAX = "tiny-vl", 10


def test_the_runner_node_fetches_the_image_from_the_api_node(tmp_path) -> None:  # noqa: ANN001
    models = tmp_path / "models"
    make_synthetic_vlm(models / MODEL)
    image = image_bytes("JPEG", (84, 56), color=(120, 20, 220))
    expected = vlm_answer(models / MODEL, image, MAX)
    cluster = Cluster(tmp_path, 2, extra_args=["--models-dir", str(models)])
    try:
        api, runner = cluster.start().nodes
        view = api.place_and_wait(MODEL, timeout=180, nodes=self_id(runner))
        assert {s["node_id"] for s in view["shards"]} == {self_id(runner)}, view
        oc = openai.OpenAI(base_url=f"{api.url}/v1", api_key="unused", max_retries=0, timeout=120)
        chat = [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                             {"type": "image_url", "image_url": {"url": data_url(image, "image/jpeg")}}]}]
        answer = oc.chat.completions.create(model=MODEL, messages=chat, temperature=0, max_tokens=MAX)
        assert answer.choices[0].message.content == expected
        assert httpx.delete(f"{api.url}/instances/{view['instance_id']}", timeout=30).status_code == 200
        wait_until(lambda: not api.get("/state").json()["instances"], 60, what="instance gone")
        split = api.place_and_wait(MODEL, timeout=180, min_nodes=2, sharding="pipeline")
        assert len(split["shards"]) == 2, split
        for node in (api, runner):
            client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=120)
            answer = client.chat.completions.create(model=MODEL, messages=chat, temperature=0, max_tokens=MAX)
            assert answer.choices[0].message.content == expected, node.url
        turn2 = [*chat, {"role": "assistant", "content": "A purple picture."}, {"role": "user", "content": "Sure?"}]
        again = oc.chat.completions.create(model=MODEL, messages=turn2, temperature=0, max_tokens=MAX)
        assert again.usage.prompt_tokens_details.cached_tokens > 0
    finally:
        cluster.stop()
