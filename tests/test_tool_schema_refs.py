"""Tools whose ``parameters`` use ``$defs`` and ``$ref`` (as Pydantic writes them, so the
OpenAI Agents SDK and LangChain send them): the API's check and the runner's grammar both
resolve the references inside the call's schema (exo_p2p/content/schema_refs.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from exo_p2p.api.families.tool_calls import schema_problem
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.content.schema_refs import rebase_refs
from exo_p2p.types.chunks import FinishChunk, TokenChunk
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.tasks import ChatMessage, GenerationParams
from worker.engine.builder import build_engine
from worker.engine.loading.loader import load_all

PARAMS = {"type": "object", "$defs": {"Unit": {"enum": ["C", "F"]}},
          "properties": {"unit": {"$ref": "#/$defs/Unit"}, "city": {"type": "string", "maxLength": 8}},
          "required": ["unit", "city"], "additionalProperties": False}


def test_rebase_refs_moves_local_references_only() -> None:
    moved = rebase_refs({"a": [{"$ref": "#/$defs/X"}, {"$ref": "other.json#/x"}], "$ref": "#"}, "#/properties/arguments")
    assert moved == {"a": [{"$ref": "#/properties/arguments/$defs/X"}, {"$ref": "other.json#/x"}], "$ref": "#/properties/arguments"}


def test_the_api_check_resolves_refs() -> None:
    assert schema_problem("f", PARAMS) is None
    assert schema_problem("f", {"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}) is not None


@pytest.mark.parametrize("agent", [False, True])
def test_a_forced_call_of_a_tool_with_refs_is_valid(tmp_path, agent: bool) -> None:
    loaded = load_all(make_synthetic_model(tmp_path / "m", agent=agent))
    tools = json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
                        {"type": "function", "function": {"name": "other", "parameters": PARAMS}}])
    params = GenerationParams(messages=(ChatMessage("user", "weather?"),), tools=tools, tool_choice="function:get_weather",
                              max_tokens=150, temperature=0.0, thinking=False)
    engine = build_engine(loaded, EngineSettings())
    engine.submit("t", params)
    chunks: list = []
    for _ in range(200):
        if not engine.has_work():
            break
        chunks += engine.step()
    calls = [c for t in chunks if isinstance(t, TokenChunk) for c in t.calls]
    assert calls and isinstance(chunks[-1], FinishChunk), chunks[-1]
    for call in calls:
        assert call.name == "get_weather"
        jsonschema.validate(json.loads(call.arguments), PARAMS)
