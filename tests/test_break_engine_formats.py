"""Formats no output can match (a ``$ref`` cycle, a regex of an empty class): the runner ends
them with a 400 before any model work, never an empty output that claims ``stop``."""

from __future__ import annotations

import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.chunks import ErrorChunk
from exo_p2p.types.tasks import OutputFormat
from tests.support.structured_engine import params, serve
from worker.engine.loading.loader import LoadedModel, load_all


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("m") / "synthetic"))


@pytest.mark.parametrize("fmt", [OutputFormat("json_schema", '{"$ref": "#"}'),
                                 OutputFormat("json_schema", '{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}'),
                                 OutputFormat("regex", r"[^\s\S]")])
def test_a_format_nothing_matches_is_a_400_not_an_empty_stop(loaded: LoadedModel, fmt: OutputFormat) -> None:
    text, end = serve(loaded, {"dead": params(fmt=fmt)})["dead"]
    assert text == ""
    assert isinstance(end, ErrorChunk), end
    assert end.error.status == 400 and end.error.param == "response_format"
    assert "no output can match" in end.error.message


def test_a_format_only_the_empty_output_matches_still_runs(loaded: LoadedModel) -> None:
    text, end = serve(loaded, {"empty": params(fmt=OutputFormat("regex", "()"))})["empty"]
    assert text == "" and not isinstance(end, ErrorChunk) and end.finish_reason == "stop"


def test_a_format_past_the_parser_limits_mid_output_is_a_400_and_the_batch_goes_on(loaded: LoadedModel) -> None:
    endless = OutputFormat("lark", 'start: "ab" x\nx: "b" x')
    out = serve(loaded, {"endless": params(fmt=endless), "free": params("hi", max_tokens=8)})
    _text, end = out["endless"]
    assert isinstance(end, ErrorChunk), end
    assert end.error.status == 400 and end.error.param == "response_format", end.error
    assert not isinstance(out["free"][1], ErrorChunk)
