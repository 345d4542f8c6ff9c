"""Shared pieces of the tool-calling tests against a real node: the agent synthetic model
(think and tool-call markers, a Qwen-like template; here its generation prompt also opens a
think block when thinking is on, as DeepSeek-R1's does, so a test can start inside one), the
tools, and what a valid call is."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from tests.support.models.synthetic_agent import AGENT_TEMPLATE
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess

AGENT_MODEL = "tiny-agent"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                  "required": ["city", "days"], "additionalProperties": False}
TIME_PARAMS = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"], "additionalProperties": False}
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
OPENAI_TOOLS = [{"type": "function", "function": {"name": name, "description": f"the {name[4:]}", "parameters": schema}}
                for name, schema in PARAMS.items()]
_CLOSED = "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
_OPENS = ("{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
          "{% elif enable_thinking %}<think>\n{% endif %}")


def agent_model(models: Path, context_length: int = 2048) -> tuple[Path, dict[str, int]]:
    """The agent model in ``models`` (thinking on opens a think block in the generation
    prompt; a context of ``context_length`` tokens) and the ids of its markers and
    end-of-turn tokens (``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``, ``eos``…)."""
    path = make_synthetic_model(models / AGENT_MODEL, n_layers=2, hidden_size=64, intermediate_size=128, seed=3, agent=True,
                                context_length=context_length)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    assert _CLOSED in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(_CLOSED, _OPENS)
    config_path.write_text(json.dumps(config, indent=2))
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    return path, ids


def agent_node(tmp_path_factory, context_length: int = 2048) -> tuple[NodeProcess, dict[str, int]]:  # type: ignore[no-untyped-def]
    """A started node serving the agent model (the caller stops it)."""
    models = tmp_path_factory.mktemp("models")
    _, ids = agent_model(models, context_length)
    node = NodeProcess(tmp_path_factory.mktemp("node"), extra_args=["--models-dir", str(models)])
    try:
        node.start()
        node.place_and_wait(AGENT_MODEL, timeout=120)
    except BaseException:
        node.stop()
        raise
    return node, ids


def check_call(name: str, arguments: str | dict) -> None:
    """A call is of a known tool and its arguments match the tool's schema."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, PARAMS[name])


def no_eos(ids: dict[str, int]) -> dict[str, int]:
    """A logit bias banning the end-of-turn tokens (so a forced answer goes on with more calls)."""
    return {str(ids[t]): -100 for t in ("<|im_end|>", "<|endoftext|>") if t in ids}
