"""Embedding benchmark: one real ``exo-p2p node`` on 127.0.0.1 against the library in-process;
prints a table (docs/api.md#embeddings-and-reranking has the figures of a run).

- throughput: inputs/s and tokens/s of ``POST /v1/embeddings`` (the ``openai`` client, which
  asks for base64 unless told otherwise, and decodes it) for
  batches of 1, 16 and 64 short texts on a synthetic BERT-shaped encoder (MiniLM's size:
  hidden 384, 6 layers; ``tests/support/models/synthetic_encoder``), and of ``mlx_embeddings.generate`` on
  the same model in this process; "ours ÷ library" per batch (the target: ≥ 0.8 at 64).
- decode beside embeddings: 8 chat streams on a synthetic decoder (``--decoder-layers``),
  completion tokens/s over ``--seconds`` alone, then with one client embedding 16 texts at a
  time on the same instance meanwhile (the target: decode keeps ≥ 0.8 of its rate).

Usage: ``python scripts/bench_embed.py [--seconds S] [--reps N]``. Needs the embeddings extra.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker import blas  # noqa: E402

# the library in-process gets the BLAS the node's runners preload (worker/blas.py), before MLX loads
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(blas.offered_cores()))
PRELOADED = blas.preload_in_process(blas.find_optimised_blas())

from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from tests.support.cluster import NodeProcess  # noqa: E402
from tests.support.models.synthetic_encoder import WORDS, make_encoder  # noqa: E402

ENCODER, DECODER = "bench-encoder", "bench-decoder"
BATCHES = (1, 16, 64)


def texts(n: int) -> list[str]:
    """``n`` short texts (~10 words), all different."""
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(8)) + f" {i}" for i in range(n)]


def timed(call, reps: int) -> float:  # type: ignore[no-untyped-def]
    """Seconds per call of ``call()`` over ``reps`` calls (after one untimed call)."""
    call()
    started = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - started) / reps


def throughput(node: NodeProcess, model_dir: Path, reps: int) -> list[tuple]:
    """(batch, ours inputs/s, ours tokens/s, library inputs/s, library tokens/s, ratio)."""
    import mlx_embeddings
    import openai

    model, tok = mlx_embeddings.load(str(model_dir))
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=300)
    rows = []
    for batch in BATCHES:
        inputs = texts(batch)
        tokens = sum(len(tok.encode(t)) for t in inputs)
        ours = timed(lambda: client.embeddings.create(model=ENCODER, input=inputs), reps)  # the client asks base64
        lib = timed(lambda: mlx_embeddings.generate(model, tok, inputs).text_embeds.tolist(), reps)
        rows.append((batch, batch / ours, tokens / ours, batch / lib, tokens / lib, lib / ours))
    return rows


def decode_rate(node: NodeProcess, seconds: float, embedding_load: bool) -> tuple[float, int]:
    """Completion tokens/s of 8 chat streams over ``seconds`` (and embedding requests answered
    meanwhile when ``embedding_load``)."""
    import openai

    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=300)
    stop_at = time.monotonic() + seconds
    counts = [0] * 8
    embedded = [0]

    def chat(i: int) -> None:
        while time.monotonic() < stop_at:
            out = client.chat.completions.create(model=DECODER, messages=[{"role": "user", "content": f"tell a story {i}"}],
                                                 max_tokens=64, temperature=0.8, seed=i)
            counts[i] += out.usage.completion_tokens

    def embed() -> None:
        while time.monotonic() < stop_at:
            client.embeddings.create(model=DECODER, input=texts(16))
            embedded[0] += 1

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(8)]
    if embedding_load:
        threads.append(threading.Thread(target=embed))
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 300)
    return sum(counts) / (time.monotonic() - started), embedded[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each decode measurement")
    parser.add_argument("--reps", type=int, default=10, help="timed calls per batch size")
    parser.add_argument("--decoder-layers", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        models = Path(tmp) / "models"
        make_encoder(models / ENCODER, hidden_size=384, n_layers=6, context=512)
        make_synthetic_model(models / DECODER, n_layers=args.decoder_layers, hidden_size=256, intermediate_size=768,
                             num_attention_heads=8, num_key_value_heads=4, seed=1)
        node = NodeProcess(Path(tmp) / "node", extra_args=["--models-dir", str(models)])
        try:
            node.start()
            node.place_and_wait(ENCODER, timeout=300)
            node.place_and_wait(DECODER, timeout=300)
            rows = throughput(node, models / ENCODER, args.reps)
            alone, _ = decode_rate(node, args.seconds, False)
            beside, embedded = decode_rate(node, args.seconds, True)
        finally:
            node.stop()
    print(f"BLAS preloaded in this process (the library's column): {PRELOADED}; load average {os.getloadavg()[0]:.1f}")
    print("| batch | ours inputs/s | ours tokens/s | library inputs/s | library tokens/s | ours ÷ library |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch, oi, ot, li, lt, ratio in rows:
        print(f"| {batch} | {oi:.1f} | {ot:.0f} | {li:.1f} | {lt:.0f} | {ratio:.2f} |")
    print(f"\n8 chat streams: {alone:.1f} tokens/s alone, {beside:.1f} tokens/s beside {embedded} embedding "
          f"requests of 16 texts ({beside / alone:.2f} of its rate)")


if __name__ == "__main__":
    main()
