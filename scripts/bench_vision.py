"""Vision-language figures, in process: image-encode time and time to first token for one
image, ours (``worker/vision``) against mlx-vlm's own ``generate`` on the same checkpoint,
image and prompt, and the time to first token of a repeated image (its features cached per
digest, ``worker.vision.features.FeatureCache``) against the first.

Ratios are mlx-vlm's time ÷ ours (target ≥ 0.9: ours no more than ~10% slower). The default
checkpoint is the tiny random Qwen2-VL of the tests (``tests/support/models/synthetic_vlm.py``);
``--model DIR`` takes any Qwen2/2.5-VL directory in mlx-vlm's layout. ``--node``: the figures
through a real node instead (``scripts/bench_vision_node.py``: time to first token, the node's
against mlx-vlm's in process, and a repeated image's against the first).

    .venv/bin/python scripts/bench_vision.py [--model DIR] [--size 448] [--runs 5] [--node]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402

from tests.support.images.samples import image_bytes  # noqa: E402
from tests.support.models.synthetic_vlm import make_synthetic_vlm  # noqa: E402
from worker.vision.features import FeatureCache, image_features  # noqa: E402
from worker.vision.greedy import greedy_tokens, vision_inputs  # noqa: E402


def _ms(fn) -> float:  # noqa: ANN001
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def _theirs_ttft(model, processor, prompt: str, picture) -> float:  # noqa: ANN001
    from mlx_vlm import stream_generate

    started = time.perf_counter()
    for _ in stream_generate(model, processor, prompt, image=[picture], max_tokens=1, temperature=0.0):
        break
    return (time.perf_counter() - started) * 1000


def measure(model_dir: Path, size: int, runs: int) -> dict[str, float]:
    """Medians over ``runs`` (milliseconds) and the ratios."""
    from mlx_vlm import load
    from mlx_vlm.prompt_utils import apply_chat_template
    from PIL import Image

    model, processor = load(str(model_dir))
    data = image_bytes("PNG", (size, size))
    picture = Image.open(io.BytesIO(data))
    digest = hashlib.sha256(data).hexdigest()
    prompt = apply_chat_template(processor, model.config, "What is in the picture?", num_images=1)
    inputs = vision_inputs(processor, model, prompt, [(digest, data)])
    tower = model.vision_tower
    rows: dict[str, list[float]] = {k: [] for k in ("encode_theirs", "encode_ours", "ttft_theirs", "ttft_ours", "ttft_cached")}
    _theirs_ttft(model, processor, prompt, picture)  # warm both paths once
    greedy_tokens(model, vision_inputs(processor, model, prompt, [(digest, data)]), 1, FeatureCache())
    for _ in range(runs):
        rows["encode_theirs"].append(_ms(lambda: mx.eval(tower(inputs.pixel_values.astype(tower.patch_embed.proj.weight.dtype),
                                                                inputs.grid_thw, output_hidden_states=False))))
        rows["encode_ours"].append(_ms(lambda: image_features(tower, inputs.pixel_values, inputs.grid_thw, (digest,), FeatureCache())))
        rows["ttft_theirs"].append(_theirs_ttft(model, processor, prompt, picture))
        cache = FeatureCache()
        rows["ttft_ours"].append(_ms(lambda: greedy_tokens(model, vision_inputs(processor, model, prompt, [(digest, data)]), 1, cache)))
        rows["ttft_cached"].append(_ms(lambda: greedy_tokens(model, vision_inputs(processor, model, prompt, [(digest, data)]), 1, cache)))
    out = {f"{k}_ms": round(statistics.median(v), 2) for k, v in rows.items()}
    out["encode_ratio"] = round(out["encode_theirs_ms"] / out["encode_ours_ms"], 3)
    out["ttft_ratio"] = round(out["ttft_theirs_ms"] / out["ttft_ours_ms"], 3)
    out["cached_over_first"] = round(out["ttft_cached_ms"] / out["ttft_ours_ms"], 3)
    out["image_tokens"] = int((inputs.input_ids == model.config.image_token_id).sum().item())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="an mlx-vlm Qwen2/2.5-VL directory (default: the tiny random one)")
    parser.add_argument("--size", type=int, default=448, help="the image's side in pixels")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--node", action="store_true", help="through a real node on 127.0.0.1 (bench_vision_node.py)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or make_synthetic_vlm(Path(tmp) / "models" / "tiny-qwen2-vl")
        if args.node:
            from scripts.bench_vision_node import measure_node

            figures = measure_node(model_dir, args.size, args.runs, Path(tmp))
        else:
            figures = measure(model_dir, args.size, args.runs)
    figures["load_average"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
