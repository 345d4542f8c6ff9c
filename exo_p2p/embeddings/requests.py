"""The bodies of ``POST /v1/embeddings`` (OpenAI), ``POST /api/embed`` and the legacy
``POST /api/embeddings`` (Ollama) and ``POST /v1/rerank`` (Jina/Cohere) as one
``EmbedRequest`` / ``RerankRequest`` (docs/api.md#embeddings-and-reranking).

Every function raises ``exo_p2p.api.errors.ApiError(400)`` naming the field for bad input;
the sizes are bounded by ``exo_p2p.embeddings.bounds`` before anything leaves the API node.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from exo_p2p.api.errors import ApiError, decode_json
from exo_p2p.embeddings.bounds import MAX_DIMENSIONS, MAX_INPUTS, MAX_RERANK_DOCUMENTS, MAX_TOKEN_ID, MAX_TOTAL_TOKENS

EmbedInput = str | tuple[int, ...]
"""One input: text, or the token ids of an already tokenized text."""


class EmbedRequest(msgspec.Struct, frozen=True):
    """An embedding request as the API node parsed it, before its texts are tokenized:
    ``inputs`` in order (the answer's vectors in the same order); ``dimensions``: Matryoshka
    shortening (None: full width); ``truncate``: an input over the model's context is cut to
    it instead of refused (400)."""

    inputs: tuple[EmbedInput, ...]
    dimensions: int | None = None
    truncate: bool = False


class RerankRequest(msgspec.Struct, frozen=True):
    """A rerank request as parsed: ``documents`` scored against ``query``; the answer keeps
    the ``top_n`` best (None: all), each with its index in ``documents``."""

    query: str
    documents: tuple[str, ...]
    top_n: int | None = None
    truncate: bool = False

EncodingFormat = Literal["float", "base64"]


class OpenAIEmbedBody(msgspec.Struct, frozen=True):
    """OpenAI's body; ``truncate`` is ours (OpenAI answers 400 for an input over 8192 tokens)."""

    model: str
    input: Any
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate: bool = False


class OllamaEmbedBody(msgspec.Struct, frozen=True):
    """Ollama's ``/api/embed``: ``truncate`` defaults to true there (cut to the context)."""

    model: str
    input: Any
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: Any = None


class OllamaLegacyBody(msgspec.Struct, frozen=True):
    """Ollama's legacy ``/api/embeddings``: one ``prompt``."""

    model: str
    prompt: str
    options: dict[str, Any] | None = None
    keep_alive: Any = None


class RerankDocument(msgspec.Struct, frozen=True):
    """A document given as an object (Cohere's and Jina's ``{"text": …}``)."""

    text: str


class RerankBody(msgspec.Struct, frozen=True):
    """Jina's and Cohere's rerank body (``return_documents`` defaults to Jina's true)."""

    model: str
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = None
    return_documents: bool = True
    truncate: bool = False


def _token_ids(value: list, param: str) -> tuple[int, ...]:
    if not value:
        raise ApiError(400, f"{param} is an empty list of token ids", param=param)
    if not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in value):
        raise ApiError(400, f"{param}: token ids must be integers within [0, {MAX_TOKEN_ID}]", param=param)
    return tuple(value)


def _one_input(value: Any, param: str) -> EmbedInput:
    if isinstance(value, str):
        if not value:
            raise ApiError(400, f"{param} is an empty string", param=param)
        return value
    if isinstance(value, list):
        return _token_ids(value, param)
    raise ApiError(400, f"{param} must be a string or a list of token ids", param=param)


def parse_inputs(value: Any, *, token_ids: bool) -> tuple[EmbedInput, ...]:
    """``input`` as a tuple of inputs: a string, a list of strings, (``token_ids``) a list of
    token ids or a list of lists of them. At most ``MAX_INPUTS`` inputs and
    ``MAX_TOTAL_TOKENS`` token ids."""
    if isinstance(value, str):
        return (_one_input(value, "input"),)
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string or a non-empty list", param="input")
    if token_ids and all(type(v) is int for v in value):
        if len(value) > MAX_TOTAL_TOKENS:
            raise ApiError(400, f"input has more than {MAX_TOTAL_TOKENS} token ids", param="input")
        return (_token_ids(value, "input"),)
    if len(value) > MAX_INPUTS:
        raise ApiError(400, f"input has {len(value)} items, over {MAX_INPUTS} per request", param="input")
    if not token_ids and not all(isinstance(v, str) for v in value):
        raise ApiError(400, "input must be a string or a list of strings", param="input")
    inputs = tuple(_one_input(v, f"input[{i}]") for i, v in enumerate(value))
    if sum(len(v) for v in inputs if not isinstance(v, str)) > MAX_TOTAL_TOKENS:
        raise ApiError(400, f"input has more than {MAX_TOTAL_TOKENS} token ids", param="input")
    return inputs


def _dimensions(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= MAX_DIMENSIONS:
        raise ApiError(400, f"dimensions must be within [1, {MAX_DIMENSIONS}]", param="dimensions")
    return value


def openai_embed(body: bytes) -> tuple[str, EmbedRequest, EncodingFormat]:
    """An OpenAI embeddings body → (model, params, encoding format)."""
    req = decode_json(body, OpenAIEmbedBody)
    params = EmbedRequest(parse_inputs(req.input, token_ids=True), _dimensions(req.dimensions), req.truncate)
    return req.model, params, req.encoding_format


def ollama_embed(body: bytes) -> tuple[str, EmbedRequest]:
    """An Ollama ``/api/embed`` body → (model, params); text inputs only, as Ollama."""
    req = decode_json(body, OllamaEmbedBody)
    return req.model, EmbedRequest(parse_inputs(req.input, token_ids=False), _dimensions(req.dimensions), req.truncate)


def ollama_legacy_embed(body: bytes) -> tuple[str, EmbedRequest]:
    """An Ollama ``/api/embeddings`` body → (model, params of its one prompt, cut to the
    context as Ollama does)."""
    req = decode_json(body, OllamaLegacyBody)
    return req.model, EmbedRequest((_one_input(req.prompt, "prompt"),), None, True)


def rerank(body: bytes) -> tuple[str, RerankRequest, bool]:
    """A rerank body → (model, params, return_documents). ``top_n`` ≥ 1; at most
    ``MAX_RERANK_DOCUMENTS`` documents, none empty; a non-empty query."""
    req = decode_json(body, RerankBody)
    if not req.query:
        raise ApiError(400, "query is an empty string", param="query")
    if not req.documents:
        raise ApiError(400, "documents is an empty list", param="documents")
    if len(req.documents) > MAX_RERANK_DOCUMENTS:
        raise ApiError(400, f"documents has {len(req.documents)} items, over {MAX_RERANK_DOCUMENTS}", param="documents")
    if req.top_n is not None and req.top_n < 1:
        raise ApiError(400, "top_n must be at least 1", param="top_n")
    docs = tuple(d if isinstance(d, str) else d.text for d in req.documents)
    for i, d in enumerate(docs):
        if not d:
            raise ApiError(400, f"documents[{i}] is empty", param=f"documents[{i}]")
    return req.model, RerankRequest(req.query, docs, req.top_n, req.truncate), req.return_documents
