"""The pure parts of embeddings and reranking: pooling read from a model's files, pooling
and normalisation of vectors, Matryoshka truncation, base64, bounds, request parsing and each
family's answer (docs/api.md#embeddings-and-reranking)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from exo_p2p.api.errors import ApiError
from exo_p2p.embeddings import answers, requests
from exo_p2p.embeddings.bounds import MAX_INPUTS, MAX_TOTAL_TOKENS, EmbedBoundError, batches, fit_lengths
from exo_p2p.embeddings.pooling import PoolingConfigError, PoolingSpec, pooling_spec
from exo_p2p.embeddings.tokens import token_rows
from exo_p2p.embeddings.vectors import NORM_EPS, cosine, from_base64, normalize, pool, to_base64, truncate

floats = st.floats(-100, 100, allow_nan=False, width=32)


def _st_model(path, pooling: dict, normalize_module: bool = True, config: dict | None = None):
    modules = [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize_module:
        modules.append({"idx": 2, "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (path / "config.json").write_text(json.dumps(config or {}))
    return path


def test_pooling_defaults_without_sentence_transformers_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert pooling_spec(tmp_path, causal=True) == PoolingSpec("last", True, False)
    assert pooling_spec(tmp_path, causal=False) == PoolingSpec("mean", True, False)


@pytest.mark.parametrize(("key", "mode"), [("pooling_mode_cls_token", "cls"), ("pooling_mode_mean_tokens", "mean"),
                                           ("pooling_mode_lasttoken", "last")])
def test_pooling_from_modules_json(tmp_path, key, mode):
    _st_model(tmp_path, {key: True}, normalize_module=False)
    assert pooling_spec(tmp_path, causal=True) == PoolingSpec(mode, False, False)


def test_normalize_module_and_matryoshka(tmp_path):
    _st_model(tmp_path, {"pooling_mode_mean_tokens": True}, config={"matryoshka_dimensions": [64, 128]})
    assert pooling_spec(tmp_path, causal=False) == PoolingSpec("mean", True, True)


@pytest.mark.parametrize("pooling", [{"pooling_mode_max_tokens": True}, {}])
def test_unsupported_pooling_is_refused(tmp_path, pooling):
    _st_model(tmp_path, pooling)
    with pytest.raises(PoolingConfigError):
        pooling_spec(tmp_path, causal=False)


def test_pooling_folder_outside_the_model_is_refused(tmp_path):
    _st_model(tmp_path, {"pooling_mode_mean_tokens": True})
    (tmp_path / "modules.json").write_text(json.dumps([{"path": "../x", "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(PoolingConfigError, match="outside"):
        pooling_spec(tmp_path, causal=False)


@pytest.mark.parametrize(("name", "lie", "why"), [
    ("modules.json", "[" * 100 + "]" * 100, "deeper than"),
    ("modules.json", "[" * 100_000, "deeper than"),
    ("1_Pooling/config.json", '{"a": "' + "x" * (1 << 20) + '"}', "larger than"),
    ("1_Pooling/config.json", b"\xff\xfe{}", "not UTF-8"),
    ("config.json", "{", "not JSON"),
])
def test_pooling_files_that_lie_are_refused(tmp_path, name, lie, why):
    """A model repository's pooling files are untrusted: too deep (even deep enough to exhaust
    Python's recursion), too large, not UTF-8 or not JSON is a ``PoolingConfigError`` naming the
    file, read with a bounded number of bytes (``exo_p2p.models.model_json.model_json_file``)."""
    _st_model(tmp_path, {"pooling_mode_mean_tokens": True})
    target = tmp_path / name
    target.write_bytes(lie if isinstance(lie, bytes) else lie.encode())
    with pytest.raises(PoolingConfigError, match=why):
        pooling_spec(tmp_path, causal=False)


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 8)), elements=floats),
       st.data())
def test_pooling_ignores_padding(hidden, data):
    b, length, _ = hidden.shape
    lengths = data.draw(st.lists(st.integers(1, length), min_size=b, max_size=b))
    noisy = hidden.copy()
    for i, n in enumerate(lengths):
        noisy[i, n:] = 1e6  # padding never read
    for mode in ("mean", "cls", "last"):
        np.testing.assert_array_equal(pool(hidden, lengths, mode), pool(noisy, lengths, mode))
    np.testing.assert_allclose(pool(hidden, lengths, "mean")[0], hidden[0, :lengths[0]].mean(axis=0), rtol=1e-5, atol=1e-4)
    assert np.array_equal(pool(hidden, lengths, "last")[0], hidden[0, lengths[0] - 1])


def test_pool_refuses_bad_lengths():
    with pytest.raises(ValueError):
        pool(np.zeros((1, 3, 2)), [4], "mean")
    with pytest.raises(ValueError):
        pool(np.zeros((1, 3, 2)), [0], "mean")


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(2, 16)), elements=floats), st.data())
def test_normalize_truncate_and_base64(vectors, data):
    unit = normalize(vectors)
    norms = np.linalg.norm(unit, axis=1)
    # a row shorter than NORM_EPS is divided by NORM_EPS, not scaled to 1 (as torch's F.normalize,
    # which sentence-transformers uses): hypothesis found [2.2e-16, 2.2e-16]
    tiny = np.linalg.norm(vectors.astype(np.float64), axis=1) < 2 * NORM_EPS
    assert np.all((np.abs(norms - 1) < 1e-4) | tiny)
    d = data.draw(st.integers(1, vectors.shape[1]))
    cut = truncate(unit, d, renormalize=True)
    assert cut.shape == (vectors.shape[0], d)
    np.testing.assert_array_equal(truncate(unit, d, renormalize=False), unit[:, :d])
    for v in unit:
        np.testing.assert_array_equal(from_base64(to_base64(v)), v)


def test_truncate_bounds_and_cosine():
    with pytest.raises(ValueError):
        truncate(np.ones((1, 4)), 5, renormalize=True)
    scores = cosine(np.array([1.0, 0.0]), np.array([[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0], [0.0, 0.0]]))
    np.testing.assert_allclose(scores, [1.0, 0.0, -1.0, 0.0])


def test_fit_lengths_and_batches():
    assert fit_lengths([3, 10], 8, truncate=True) == [3, 8]
    with pytest.raises(EmbedBoundError, match="context"):
        fit_lengths([3, 10], 8, truncate=False)
    with pytest.raises(EmbedBoundError, match="empty"):
        fit_lengths([0], 8, truncate=True)
    with pytest.raises(EmbedBoundError, match="together"):
        fit_lengths([MAX_TOTAL_TOKENS, 1], MAX_TOTAL_TOKENS, truncate=False)
    assert batches([10, 10, 10, 100], budget=40) == [[0, 1, 2], [3]]
    assert batches([50], budget=40) == [[0]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=40), st.integers(1, 500))
def test_batches_cover_every_input_once_within_budget(lengths, budget):
    groups = batches(lengths, budget)
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    for g in groups:
        assert len(g) == 1 or max(lengths[i] for i in g) * len(g) <= budget


def test_token_rows():
    encode = lambda text: [1, *range(10, 10 + len(text.split())), 2]  # noqa: E731
    assert token_rows(["a b", (5, 6)], encode, context=8, vocab=100, truncate=False) == ((1, 10, 11, 2), (5, 6))
    assert token_rows(["a b c d e f g h"], encode, context=4, vocab=100, truncate=True) == ((1, 10, 11, 12),)
    with pytest.raises(EmbedBoundError, match="vocabulary"):
        token_rows([(5, 100)], encode, context=8, vocab=100, truncate=False)


def _body(**kw) -> bytes:
    return json.dumps({"model": "m", **kw}).encode()


def test_openai_inputs():
    assert requests.openai_embed(_body(input="hi"))[1].inputs == ("hi",)
    assert requests.openai_embed(_body(input=["a", "b"]))[1].inputs == ("a", "b")
    assert requests.openai_embed(_body(input=[1, 2]))[1].inputs == ((1, 2),)
    assert requests.openai_embed(_body(input=[[1], [2, 3]]))[1].inputs == ((1,), (2, 3))
    model, req, enc = requests.openai_embed(_body(input="x", encoding_format="base64", dimensions=8))
    assert (model, req.dimensions, enc) == ("m", 8, "base64")


@pytest.mark.parametrize("body", [
    _body(input=""), _body(input=[]), _body(input=[""]), _body(input=["a", 1]), _body(input=[[-1]]),
    _body(input=[[]]), _body(input={"a": 1}), _body(input="x", encoding_format="hex"), _body(input="x", dimensions=0),
    _body(input=["a"] * (MAX_INPUTS + 1)), _body(), b"{", b"",
])
def test_openai_bad_bodies_are_400(body):
    with pytest.raises(ApiError) as err:
        requests.openai_embed(body)
    assert err.value.info.status == 400


def test_ollama_bodies():
    model, req = requests.ollama_embed(_body(input=["a", "b"]))
    assert req.inputs == ("a", "b") and req.truncate is True
    assert requests.ollama_embed(_body(input="a", truncate=False))[1].truncate is False
    with pytest.raises(ApiError):
        requests.ollama_embed(_body(input=[1, 2]))  # Ollama takes text only
    assert requests.ollama_legacy_embed(_body(prompt="hi"))[1].inputs == ("hi",)
    with pytest.raises(ApiError):
        requests.ollama_legacy_embed(_body(prompt=""))


def test_rerank_bodies():
    model, req, docs = requests.rerank(_body(query="q", documents=["a", {"text": "b"}], top_n=1))
    assert (req.query, req.documents, req.top_n, docs) == ("q", ("a", "b"), 1, True)
    for bad in (_body(query="", documents=["a"]), _body(query="q", documents=[]), _body(query="q", documents=[""]),
                _body(query="q", documents=["a"], top_n=0), _body(query="q", documents=[3])):
        with pytest.raises(ApiError):
            requests.rerank(bad)


def test_answers():
    vecs = np.array([[1.0, 0.0], [0.6, 0.8]], dtype=np.float32)
    body = answers.openai_answer("m", vecs, 7, "float")
    assert body["data"][1] == {"object": "embedding", "index": 1, "embedding": [pytest.approx(0.6), pytest.approx(0.8)]}
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    b64 = answers.openai_answer("m", vecs, 7, "base64")["data"][1]["embedding"]
    np.testing.assert_array_equal(from_base64(b64), vecs[1])
    assert answers.ollama_answer("m", vecs, 7, 0.5)["prompt_eval_count"] == 7
    assert answers.ollama_legacy_answer(vecs) == {"embedding": [1.0, 0.0]}
    out = answers.rerank_answer("m", ["a", "b", "c"], [0.1, 0.9, 0.1], top_n=2, return_documents=True, tokens=5,
                                scoring=answers.scoring_of(("embed", "rerank")))
    assert [r["index"] for r in out["results"]] == [1, 0]
    assert out["results"][0]["document"] == {"text": "b"} and out["meta"] == {"scoring": "embedding-cosine"}
    assert answers.scoring_of(("rerank",)) == "cross-encoder"
    with pytest.raises(ValueError):
        answers.rerank_answer("m", ["a"], [0.1, 0.2], top_n=None, return_documents=False, tokens=1, scoring="x")


def test_cli_summary_lines():
    from exo_p2p.cli.chat.embed import summary_lines
    from exo_p2p.cli.errors import CliError

    answer = {"data": [{"index": 0, "embedding": [0.5, -0.25, 0.0]}], "usage": {"prompt_tokens": 4}}
    assert summary_lines(answer, ["hello world"], shown=2) == ["[0] dim 3: +0.5000 -0.2500 …  (hello world)", "4 tokens"]
    with pytest.raises(CliError):
        summary_lines({"error": "x"}, [])
