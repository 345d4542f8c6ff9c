"""Vision figures through a real node (``bench_vision.py --node``): time to first token of a
request with one image, the node's (HTTP, cluster, runner: ``worker/vision``) against mlx-vlm's
own ``stream_generate`` in this process on the same checkpoint, image and prompt, the node's time to first token of a short text request (what the node's own
path costs, HTTP to runner and back: on a tiny model it dominates), and the node's
time to first token when the same image and prompt come again (the prompt cache holds the
image part: no tower, no prefill but the last token) against the first.

Each run alternates the three on a new image (another colour: neither the features nor the
prompt cache know it), so the machine's load falls on all alike; medians, in milliseconds,
with the load average before and after. The node is started on a free port of 127.0.0.1 with
the checkpoint's directory as its models directory and stopped at the end.
"""

from __future__ import annotations

import io
import os
import statistics
import time
from pathlib import Path

import httpx

from tests.support.cluster import NodeProcess
from tests.support.images.samples import data_url, image_bytes

QUESTION = "What is in the picture?"


def _node_ms(url: str, model: str, image: bytes | None, text: str = QUESTION) -> float:
    content: list[dict] = [{"type": "text", "text": text}]
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": data_url(image)}})
    body = {"model": model, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": content}]}
    started = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    return (time.perf_counter() - started) * 1000


def _theirs_ms(vlm, processor, prompt: str, image: bytes) -> float:  # noqa: ANN001
    from mlx_vlm import stream_generate
    from PIL import Image

    started = time.perf_counter()
    for _ in stream_generate(vlm, processor, prompt, image=[Image.open(io.BytesIO(image))], max_tokens=1, temperature=0.0):
        break
    return (time.perf_counter() - started) * 1000


def measure_node(model_dir: Path, size: int, runs: int, work: Path) -> dict[str, float]:
    """Medians over ``runs`` (ms) and the ratios (module docstring); ``work``: a scratch dir."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_vlm.utils import load as load_vlm

    from exo_p2p.types import ChatMessage, GenerationParams, ImageRef
    from worker.vision.rows import render_prompt

    vlm, processor = load_vlm(str(model_dir))
    ref = ImageRef(digest="0" * 64, media_type="image/png", width=size, height=size, size=1)
    prompt = render_prompt(GenerationParams(messages=(ChatMessage("user", QUESTION, images=(ref,)),)), load_tokenizer(model_dir))
    node = NodeProcess(work / "node", extra_args=["--models-dir", str(model_dir.parent)])
    rows: dict[str, list[float]] = {"ttft_node_first": [], "ttft_node_repeated": [], "ttft_mlx_vlm": [], "ttft_node_text": []}
    load_before = os.getloadavg()[0]
    try:
        node.start()
        node.place_and_wait(model_dir.name, timeout=300)
        warm = image_bytes("PNG", (size, size), color=(1, 2, 3))
        _node_ms(node.url, model_dir.name, warm), _theirs_ms(vlm, processor, prompt, warm)  # first-use costs out
        for i in range(runs):
            image = image_bytes("PNG", (size, size), color=(10 + 20 * i % 230, 200 - 7 * i % 190, 40 + 13 * i % 200))
            rows["ttft_node_first"].append(_node_ms(node.url, model_dir.name, image))
            rows["ttft_node_repeated"].append(_node_ms(node.url, model_dir.name, image))
            rows["ttft_mlx_vlm"].append(_theirs_ms(vlm, processor, prompt, image))
            rows["ttft_node_text"].append(_node_ms(node.url, model_dir.name, None, f"Run {i}: {QUESTION}"))
    finally:
        node.stop()
    out = {f"{k}_ms": round(statistics.median(v), 2) for k, v in rows.items()}
    out["ttft_ratio_mlx_vlm_over_node"] = round(out["ttft_mlx_vlm_ms"] / out["ttft_node_first_ms"], 3)
    out["node_overhead_ms"] = round(out["ttft_node_text_ms"], 2)  # a text request's whole path: the node's own cost
    out["repeated_over_first"] = round(out["ttft_node_repeated_ms"] / out["ttft_node_first_ms"], 3)
    out["load_average_before"], out["load_average_after"] = round(load_before, 2), round(os.getloadavg()[0], 2)
    return out
