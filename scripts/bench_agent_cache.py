"""How much of each turn of a replayed agent session the prompt cache serves.

A six-turn tool session on one engine (in process, no node): the system prompt, a user
question, then each turn the model's answer (calls forced on even turns with
``tool_choice=required``, ``auto`` on odd ones) and a result per call appended, as an agent
does. Prints, per turn, the prompt's tokens, the tokens reused from the prompt cache (turn N+1
should reuse all of turn N: its prompt and its answer, rendered byte-stable) and the share.

    .venv/bin/python scripts/bench_agent_cache.py [--model-dir DIR] [--turns 6]

Default model: the embedded SmolLM2 (its MLX copy in the data dir, made by any earlier
``exo-p2p run``; the generic tool format). Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                                                     "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                     "required": ["a", "b"], "additionalProperties": False}}},
]


def default_model_dir() -> Path:
    from exo_p2p.config import default_data_dir

    return default_data_dir() / "models" / "smollm2-135m-instruct"


def run_turn(engine, task_id: str, params) -> tuple[object, list, str, int]:  # type: ignore[no-untyped-def]
    """Serve one turn; its finish chunk, calls, text and the prompt tokens it prefilled."""
    from exo_p2p.types.chunks import FinishChunk, TokenChunk

    before = engine.prefilled_tokens
    engine.submit(task_id, params)
    chunks: list = []
    for _ in range(10_000):
        if not engine.has_work():
            break
        chunks += engine.step()
    end = next(c for c in chunks if isinstance(c, FinishChunk))
    calls = [c for t in chunks if isinstance(t, TokenChunk) for c in t.calls]
    text = "".join(t.text for t in chunks if isinstance(t, TokenChunk))
    return end, calls, text, engine.prefilled_tokens - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--prompt-cache-bytes", type=int, default=256 << 20)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from exo_p2p.types import ChatMessage, GenerationParams
    from exo_p2p.types.engine import EngineSettings
    from worker.engine.builder import build_engine
    from worker.engine.loading.loader import load_all

    model_dir = args.model_dir or default_model_dir()
    engine = build_engine(load_all(model_dir), EngineSettings(prompt_cache_bytes=args.prompt_cache_bytes))
    messages = [ChatMessage("system", "You are a helpful assistant."),
                ChatMessage("user", "What is the weather in Paris and in Rome, and what is 2 + 3?")]
    print(f"model {model_dir.name}, prompt cache {args.prompt_cache_bytes} bytes")
    for turn in range(args.turns):
        params = GenerationParams(messages=tuple(messages), tools=json.dumps(TOOLS), max_tokens=40, temperature=0.0,
                                  tool_choice="required" if turn % 2 == 0 else "auto")
        end, calls, text, prefilled = run_turn(engine, f"turn{turn}", params)
        total = end.prompt_tokens  # type: ignore[attr-defined]
        print(f"turn {turn + 1}: prompt {total} tokens, reused {total - prefilled} ({(total - prefilled) / total:.0%}), "
              f"finish {end.finish_reason}, calls {[(c.name, c.arguments) for c in calls]}")  # type: ignore[attr-defined]
        messages.append(ChatMessage("assistant", text, tool_calls=tuple(calls)))
        messages += [ChatMessage("tool", json.dumps({"result": "sunny, 21 C"}), tool_call_id=c.id, name=c.name) for c in calls]
        if not calls:
            messages.append(ChatMessage("user", "And tomorrow?"))


if __name__ == "__main__":
    main()
