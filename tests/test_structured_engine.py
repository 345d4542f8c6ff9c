"""Constrained decoding in the engine (worker/engine/answer/constraint.py), in process, on a tiny
synthetic model: every finished output matches its format, free rows in a mixed batch keep
their solo output, masks are computed only for constrained batches, a resumed request keeps
its grammar state, bad formats end with a 400, and the bit unpacking is exact."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.content.output_format import format_problem
from exo_p2p.types.chunks import ErrorChunk, FinishChunk
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.tasks import GenerationParams, OutputFormat
from worker.engine.builder import build_engine
from worker.engine.answer.constraint import unpack_bits
from worker.engine.loading.loader import LoadedModel, load_all
from tests.support.structured_engine import loaded, params, result, run, serve


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def same(a: tuple[str, FinishChunk | ErrorChunk], b: tuple[str, FinishChunk | ErrorChunk]) -> bool:
    """Equal text, finish reason and token count (timings differ)."""
    ends = [(e.finish_reason, e.completion_tokens) if isinstance(e, FinishChunk) else e.error for _t, e in (a, b)]
    return a[0] == b[0] and ends[0] == ends[1]


def test_unpack_bits_is_exact() -> None:
    rng = np.random.default_rng(1)
    words = rng.integers(-(2**31), 2**31, size=(3, 5), dtype=np.int64).astype(np.int32)
    got = np.array(unpack_bits(mx.array(words), 150))
    want = np.array([[(int(w) >> j) & 1 for w in row for j in range(32)][:150] for row in words], dtype=bool)
    assert (got == want).all()


def test_formats_hold_and_free_rows_keep_their_solo_output(loaded: LoadedModel) -> None:
    formats = {
        "schema": OutputFormat("json_schema", json.dumps(PERSON)),
        "object": OutputFormat("json_object"),
        "regex": OutputFormat("regex", r"[0-9]{3}-[a-z]{2}"),
        "lark": OutputFormat("lark", 'start: "yes" | "no"'),
    }
    free = {f"free{i}": params(f"tell me {i}", max_tokens=30) for i in range(4)}
    solo = {k: serve(loaded, {k: p})[k] for k, p in free.items()}
    mixed = serve(loaded, {**{k: params(fmt=f, max_tokens=200) for k, f in formats.items()}, **free})
    for k in free:
        assert same(mixed[k], solo[k])
    text, end = mixed["schema"]
    assert isinstance(end, FinishChunk) and end.finish_reason == "stop", (text, end)
    jsonschema.validate(json.loads(text), PERSON)
    text, end = mixed["regex"]
    assert isinstance(end, FinishChunk) and end.finish_reason == "stop" and re.fullmatch(r"[0-9]{3}-[a-z]{2}", text)
    assert mixed["lark"][0] in ("yes", "no")
    text, end = mixed["object"]
    if isinstance(end, FinishChunk) and end.finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_constrained_rows_in_a_batch_equal_their_solo_output(loaded: LoadedModel) -> None:
    fmt = OutputFormat("json_schema", json.dumps(PERSON))
    reqs = {f"c{i}": params(f"person {i}", fmt, max_tokens=60) for i in range(3)}
    reqs["seeded"] = params("person x", fmt, max_tokens=60, temperature=0.8, seed=7)
    solo = {k: serve(loaded, {k: p})[k] for k, p in reqs.items()}
    batch = serve(loaded, reqs)
    assert all(same(batch[k], solo[k]) for k in reqs)


def test_only_constrained_batches_compute_masks(loaded: LoadedModel) -> None:
    gen = build_engine(loaded, EngineSettings(max_batch=4))
    gen.submit("free", params(max_tokens=10))
    run(gen)
    assert gen.grammars is None
    gen.submit("c", params(fmt=OutputFormat("regex", "[a-z]{5}")))
    text, end = result(run(gen), "c")
    assert re.fullmatch("[a-z]{5}", text) and isinstance(end, FinishChunk) and end.finish_reason == "stop"
    assert gen.grammars is not None and gen.grammars.mask_calls >= 5


def test_a_resumed_request_continues_its_grammar(loaded: LoadedModel) -> None:
    fmt = OutputFormat("json_schema", json.dumps(PERSON))
    tokens: list[int] = []
    gen = build_engine(loaded, EngineSettings(), on_token=lambda _t, tok: tokens.append(tok))
    gen.submit("whole", params("someone", fmt, max_tokens=80))
    whole = result(run(gen), "whole")
    done = tokens[:7]
    sent = loaded.tokenizer.decode(done)
    resumed = serve(loaded, {"rest": params("someone", fmt, max_tokens=80, resume_tokens=tuple(done),
                                            origin_task_id="whole")})["rest"]
    assert sent + resumed[0] == whole[0]
    assert resumed[1].finish_reason == whole[1].finish_reason  # type: ignore[union-attr]


def test_a_resume_outside_the_format_is_a_400(loaded: LoadedModel) -> None:
    bad = tuple(loaded.tokenizer.encode("hello"))
    _text, end = serve(loaded, {"r": params(fmt=OutputFormat("regex", "[0-9]+"), resume_tokens=bad)})["r"]
    assert isinstance(end, ErrorChunk) and end.error.status == 400 and end.error.param == "resume_tokens"


@pytest.mark.parametrize("fmt", [OutputFormat("json_schema", '{"type": "nope"}'), OutputFormat("regex", "(a"),
                                 OutputFormat("lark", "start: x"), OutputFormat("json_schema", "[1, 2]")])
def test_bad_formats_end_with_a_400_before_any_model_work(loaded: LoadedModel, fmt: OutputFormat) -> None:
    assert format_problem(fmt)
    _text, end = serve(loaded, {"bad": params(fmt=fmt)})["bad"]
    assert isinstance(end, ErrorChunk) and end.error.status == 400 and end.error.param == "response_format"


_names = st.sampled_from(["a", "b", "id", "xy"])
_leaf = st.one_of(
    st.just({"type": "boolean"}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 100)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.lists(st.sampled_from(["x", "y", "zz"]), min_size=1, max_size=3, unique=True).map(lambda e: {"enum": e}),
)


def _object(children: st.SearchStrategy) -> st.SearchStrategy:
    def build(props: dict, required: list[str]) -> dict:
        return {"type": "object", "properties": props, "required": sorted(set(required) & set(props)),
                "additionalProperties": False}
    return st.builds(build, st.dictionaries(_names, children, max_size=3), st.lists(_names, max_size=3))


_schemas = st.recursive(_leaf, lambda c: st.one_of(
    _object(c),
    st.builds(lambda items, lo: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + 2},
              c, st.integers(0, 2)),
    st.lists(c, min_size=2, max_size=2).map(lambda alts: {"anyOf": alts}),
), max_leaves=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(schema=_schemas, temperature=st.sampled_from([0.0, 0.9]))
def test_generated_schemas_hold_whenever_the_output_stops(loaded: LoadedModel, schema: dict,
                                                          temperature: float) -> None:
    fmt = OutputFormat("json_schema", json.dumps(schema))
    text, end = serve(loaded, {"g": params("data", fmt, max_tokens=150, temperature=temperature, seed=3)})["g"]
    assert isinstance(end, FinishChunk), end
    if end.finish_reason == "stop":
        jsonschema.validate(json.loads(text), schema)


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The synthetic model with think and tool-call markers (``agent=True``)."""
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("a") / "agent", agent=True))


def test_the_format_starts_after_the_reasoning(thinker: LoadedModel) -> None:
    """A prompt that ends inside a think block: the reasoning is free (here forced to end at
    once by a logit bias on the think-end token), the format holds from there on."""
    start, end = thinker.tokenizer.think_start_id, thinker.tokenizer.think_end_id
    p = GenerationParams(messages=(), prompt="<|im_start|>user\nn?<|im_end|>\n<|im_start|>assistant\n<think>\n",
                         max_tokens=20, temperature=0.0, logit_bias=((end, 100.0),),
                         output_format=OutputFormat("regex", "[0-9]{3}"))
    text, fin = serve(thinker, {"t": p})["t"]
    assert isinstance(fin, FinishChunk) and fin.finish_reason == "stop", (text, fin)
    assert re.fullmatch("[0-9]{3}", text), text  # the think end is a marker, not content (output_parser)
    gen = build_engine(thinker, EngineSettings())
    gen.submit("x", params(fmt=OutputFormat("regex", "[0-9]{3}")))
    run(gen)
    row = gen.grammars.constraint(OutputFormat("regex", "[0-9]{3}"), [1, 2])  # type: ignore[union-attr]
    allowed = np.array(row.mask()).reshape(-1)
    assert allowed[start] and not allowed[end] and allowed[thinker.tokenizer.encode("7")[0]]


def test_object_schemas_with_properties_are_closed_unless_they_say_otherwise() -> None:
    from exo_p2p.content.output_format import close_objects

    got = close_objects({"type": "object", "properties": {"a": {"properties": {"b": {}}}},
                         "$defs": {"P": {"properties": {"x": {}}}},
                         "allOf": [{"properties": {"c": {}}}], "anyOf": [{"properties": {"y": {}}, "additionalProperties": True}]})
    assert got["additionalProperties"] is False and got["properties"]["a"]["additionalProperties"] is False
    assert got["$defs"]["P"]["additionalProperties"] is False
    assert "additionalProperties" not in got["allOf"][0]  # each part of an allOf stays open
    assert got["anyOf"][0]["additionalProperties"] is True
    assert close_objects({"type": "object"}) == {"type": "object"}  # json_object: any object
