"""Requests of Ollama's native API read into ``GenerationParams``: the request types of
``/api/chat``, ``/api/generate`` and ``/api/show``, and the rules that map Ollama's ``options``,
``format``, ``tools`` and ``think`` to ours (what each option becomes, which are ignored and
which refused: the module docstring of ``exo_p2p.api.families.ollama.generations``).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from exo_p2p.api.bounds import check_stop
from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.common import check_range, refuse_set
from exo_p2p.api.families.logprob_shapes import requested
from exo_p2p.api.families.ollama.tools import ollama_message, ollama_tool_fields, think_fields
from exo_p2p.api.formats import extensions, ollama_format, output_format
from exo_p2p.api.schemas import MAX_TOKENS_LIMIT, NonEmptyStr
from exo_p2p.api.vision.admit import check_count
from exo_p2p.api.vision.parts import image_from_base64
from exo_p2p.types import ChatMessage, GenerationParams, ImageRef

RUNTIME_OPTIONS = frozenset({
    "num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap", "use_mlock", "numa",
    "low_vram", "vocab_only", "num_keep", "f16_kv", "logits_all", "embedding_only", "penalize_newline",
})
"""Options that tune Ollama's runtime, not the sampled text: ignored."""
OPTION_INT_LIMIT = 2**64
"""Largest absolute integer an option may be (JSON integers of hundreds of digits decode, and
no float holds them)."""
_ROLES = ("system", "user", "assistant", "tool")


class OllamaMessage(msgspec.Struct, frozen=True):
    role: str
    content: str = ""
    images: list[Any] | None = None
    tool_calls: list[Any] | None = None
    tool_name: str | None = None


class ChatRequest(msgspec.Struct, frozen=True):
    """``POST /api/chat`` (unknown fields ignored)."""

    model: NonEmptyStr
    messages: list[OllamaMessage] | None = None
    stream: bool = True
    format: Any = None
    options: dict[str, Any] | None = None
    keep_alive: Any = None
    tools: list[Any] | None = None
    think: Any = None
    regex: str | None = None
    grammar: str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class GenerateRequest(msgspec.Struct, frozen=True):
    """``POST /api/generate`` (unknown fields ignored)."""

    model: NonEmptyStr
    prompt: str = ""
    system: str | None = None
    stream: bool = True
    raw: bool = False
    format: Any = None
    options: dict[str, Any] | None = None
    keep_alive: Any = None
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[Any] | None = None
    think: Any = None
    regex: str | None = None
    grammar: str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class ShowRequest(msgspec.Struct, frozen=True):
    """``POST /api/show``: ``model`` (or the older ``name``)."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None


def _number(options: dict[str, Any], key: str, kind: type = float) -> Any:
    """``options[key]`` as ``kind`` (None when absent); 400 for a value that is no finite number,
    an integer beyond ``OPTION_INT_LIMIT`` (a float could not even hold it), or a fraction
    where an integer is due."""
    value = options.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int) and abs(value) > OPTION_INT_LIMIT)
            or not math.isfinite(value) or (kind is int and value != int(value))):
        raise ApiError(400, f"options.{key} must be {'an integer' if kind is int else 'a number'}, got {value!r:.40}", param=f"options.{key}")
    return kind(value)


def options_fields(options: dict[str, Any] | None) -> dict[str, Any]:
    """``GenerationParams`` fields from Ollama ``options`` (see the module docstring)."""
    o = options or {}
    refuse_set([
        ("options.mirostat", bool(o.get("mirostat")), "mirostat sampling is not supported"),
        ("options.tfs_z", o.get("tfs_z") not in (None, 1, 1.0), "tail-free sampling is not supported"),
        ("options.typical_p", o.get("typical_p") not in (None, 1, 1.0), "typical sampling is not supported"),
    ])
    fields: dict[str, Any] = {}
    temperature = _number(o, "temperature")
    check_range("options.temperature", temperature, 0.0, 100.0)
    top_p = _number(o, "top_p")
    check_range("options.top_p", top_p, 0.0, 1.0, low_open=True)
    top_k = _number(o, "top_k", int)
    check_range("options.top_k", top_k, 0, 2**31)
    min_p = _number(o, "min_p")
    check_range("options.min_p", min_p, 0.0, 1.0)
    repeat = _number(o, "repeat_penalty")
    check_range("options.repeat_penalty", repeat, 0.0, 10.0, low_open=True)
    presence, frequency = _number(o, "presence_penalty"), _number(o, "frequency_penalty")
    check_range("options.presence_penalty", presence, -2.0, 2.0)
    check_range("options.frequency_penalty", frequency, -2.0, 2.0)
    seed = _number(o, "seed", int)
    num_predict = _number(o, "num_predict", int)
    check_range("options.num_predict", num_predict, -MAX_TOKENS_LIMIT, MAX_TOKENS_LIMIT)
    last_n = _number(o, "repeat_last_n", int)
    check_range("options.repeat_last_n", last_n, -MAX_TOKENS_LIMIT, MAX_TOKENS_LIMIT)
    for key, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k), ("min_p", min_p),
                       ("repetition_penalty", repeat), ("presence_penalty", presence), ("frequency_penalty", frequency)):
        if value is not None:
            fields[key] = value
    if seed is not None:
        fields["seed"] = seed & ((1 << 63) - 1)
    if num_predict is not None and num_predict >= 0:
        if num_predict == 0:
            raise ApiError(400, "options.num_predict must be at least 1 (or -1 for no limit)", param="options.num_predict")
        fields["max_tokens"] = num_predict
    if last_n is not None:
        if last_n == 0:  # Ollama: 0 disables the repeat window
            fields.update(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
        elif last_n > 0:
            fields["penalty_context"] = last_n
    stop = o.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ApiError(400, "options.stop must be a list of strings", param="options.stop")
        fields["stop"] = check_stop(stop, "options.stop")
    return fields


def _format_field(r: ChatRequest | GenerateRequest) -> dict[str, Any]:
    """The output format (``format``, ``regex``, ``grammar``: ``exo_p2p.api.formats``)."""
    return {"output_format": output_format(ollama_format(r.format), *extensions(r.regex, r.grammar))}


def _logprobs_field(r: ChatRequest | GenerateRequest) -> dict[str, Any]:
    """``logprobs`` / ``top_logprobs`` (0..20) as ``GenerationParams.logprobs``."""
    return {"logprobs": requested(r.logprobs, r.top_logprobs)}


def chat_params(r: ChatRequest) -> GenerationParams | None:
    """``GenerationParams`` of ``/api/chat``; None for a load request (no messages)."""
    fields = options_fields(r.options) | ollama_tool_fields(r.tools, r.think) | _format_field(r) | _logprobs_field(r)
    if not r.messages:
        return None
    check_count(sum(len(m.images or ()) for m in r.messages), "messages")
    messages = []
    for i, m in enumerate(r.messages):
        if m.role not in _ROLES:
            raise ApiError(400, f"messages[{i}].role must be system, user, assistant or tool, got {m.role[:64]!r}", param=f"messages[{i}].role")
        if m.images and m.role != "user":
            raise ApiError(400, f"messages[{i}].images: only user messages carry images", param=f"messages[{i}].images")
        if m.tool_calls or m.role == "tool":
            messages.append(ollama_message(i, m.role, m.content, m.tool_calls, m.tool_name))
        else:
            messages.append(ChatMessage(m.role, m.content, images=ollama_images(f"messages[{i}].images", m.images)))
    return GenerationParams(messages=tuple(messages), **fields)


def ollama_images(where: str, images: list[Any] | None) -> tuple[ImageRef, ...]:
    """Ollama's ``images``: a list of base64 strings (``exo_p2p.api.vision.parts.image_from_base64``;
    the count over the whole request is checked before any is decoded)."""
    return tuple(image_from_base64(f"{where}[{j}]", data) for j, data in enumerate(images or ()))


def generate_params(r: GenerateRequest) -> GenerationParams | None:
    """``GenerationParams`` of ``/api/generate``; None for a load request (empty prompt)."""
    refuse_set([
        ("suffix", bool(r.suffix), "insertion (suffix) is not supported"),
        ("template", bool(r.template), "custom prompt templates are not supported (use raw: true with a formatted prompt)"),
        ("context", bool(r.context), "the token context of an earlier answer is not supported; use /api/chat"),
        ("images", bool(r.images) and r.raw, "images cannot be placed in a raw prompt; send raw: false"),
    ])
    fields = options_fields(r.options) | think_fields(r.think) | _format_field(r) | _logprobs_field(r)
    if not r.prompt:
        return None
    if r.raw:
        return GenerationParams(messages=(), prompt=r.prompt, **fields)
    check_count(len(r.images or ()), "images")
    user = ChatMessage("user", r.prompt, images=ollama_images("images", r.images))
    messages = ([ChatMessage("system", r.system)] if r.system else []) + [user]
    return GenerationParams(messages=tuple(messages), **fields)
