"""An agent session across a restart: what the prompt cache's disk tier saves (docs/benchmarks.md).

An 8-turn session (a long system prompt, then each turn the previous answer and a new
request, greedy) on one engine in process with the disk tier in a temporary directory; after
turn 4 the engine is closed and built again over the same directory (RAM empty: a runner's
restart, the weights' load left out), and turns 5–8 are served. Prints turn 5's time to
first token restored from disk against a cold prefill of the same prompt (a fresh engine
without the tier), the tokens restored, the blocks' bytes, and whether all 8 answers equal a
run without the tier.

    .venv/bin/python scripts/bench_agent_restart.py [--model-dir DIR] [--system-tokens 6000]

Default model: the embedded SmolLM2 (its MLX copy in the data dir, made by any earlier
``exo-p2p run``); ``--synthetic`` uses the tests' tiny synthetic model instead.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def engine(loaded, directory: str = "", cache: int = 256 << 20):  # type: ignore[no-untyped-def]
    from exo_p2p.types.engine import EngineSettings
    from worker.engine.builder import build_engine

    return build_engine(loaded, EngineSettings(prompt_cache_bytes=cache, prompt_cache_disk_bytes=(1 << 30) if directory else 0,
                                               prompt_cache_dir=directory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--system-tokens", type=int, default=6000)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from exo_p2p.config import default_data_dir
    from tests.support.agent_session import replay, serve, session_messages, system_prompt
    from worker.engine.loading.loader import load_all

    with tempfile.TemporaryDirectory() as tmp:
        if args.synthetic:
            from tests.support.models.synthetic_models import make_synthetic_model

            model_dir = make_synthetic_model(Path(tmp) / "synthetic", n_layers=4, context_length=16384)
        else:
            model_dir = args.model_dir or default_data_dir() / "models" / "smollm2-135m-instruct"
        loaded = load_all(model_dir)
        probe = len(loaded.tokenizer.encode(system_prompt(args.system_tokens)))
        system = system_prompt(args.system_tokens * args.system_tokens // max(1, probe))  # this tokenizer's count
        reference: list[str] = []
        replay(engine(loaded), system, range(8), reference)
        answers: list[str] = []
        first = engine(loaded, tmp + "/tier")
        replay(first, system, range(4), answers)
        first.prompt_cache.disk.close()
        cold = serve(engine(loaded), "cold", session_messages(system, 4, reference))
        again = engine(loaded, tmp + "/tier")
        turns = replay(again, system, range(4, 8), answers)
        cache = again.prompt_cache
        print(f"model {Path(model_dir).name}: turn 5 prompt {turns[0].prompt_tokens} tokens; TTFT restored "
              f"{turns[0].ttft * 1000:.0f} ms vs cold prefill {cold.ttft * 1000:.0f} ms ({cold.ttft / turns[0].ttft:.1f}x); "
              f"{cache.restored_tokens} tokens restored; disk tier {cache.disk.nbytes / 2**20:.1f} MiB in "
              f"{cache.disk.blocks} blocks; answers equal to the run without the tier: {answers == reference}")
        cache.disk.close()


if __name__ == "__main__":
    main()
