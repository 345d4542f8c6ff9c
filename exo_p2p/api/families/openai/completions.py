"""OpenAI (legacy) completions, ``POST /v1/completions``: a raw prompt, no chat template.

The prompt is one string (or a list of exactly one string); ``response_format`` (as in chat,
an extension here, as in vLLM), ``regex`` and ``grammar`` constrain the output
(``exo_p2p.api.formats``); ``echo``, ``suffix``,
``best_of`` > 1 and ``n`` > 1 are refused by name; ``logprobs: N`` (0..20) gives the legacy
``logprobs`` object (``logprob_shapes.legacy``). Bodies are ``text_completion`` objects
(``choices[].logprobs`` null unless asked for); a stream is
``text_completion`` events, the last with a ``finish_reason``, [a usage event], then
``data: [DONE]``.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
from starlette.requests import Request
from starlette.routing import Route

from exo_p2p.api.context import ApiContext
from exo_p2p.api.errors import ApiError, error_body
from exo_p2p.api.families.common import SSE_KEEPALIVE, SSE_MEDIA_TYPE, logit_bias_pairs, refuse_set, sse, stop_strings
from exo_p2p.api.families.openai.chat import DONE, openai_finish_reason
from exo_p2p.api.families.logprob_shapes import legacy, requested
from exo_p2p.api.formats import extensions, openai_response_format, output_format
from exo_p2p.api.generation.turn import Turn
from exo_p2p.api.generation.path import GenerationResponse
from exo_p2p.api.generation.job import GenerationJob, new_task_id
from exo_p2p.api.schemas import (
    CachedTokens,
    MinP,
    NonEmptyStr,
    Penalty,
    PositiveTokens,
    RepetitionPenalty,
    Seed,
    StopList,
    StreamOptions,
    Temperature,
    TopK,
    TopP,
    Usage,
)
from exo_p2p.types import ErrorInfo, FinishChunk, GenerationParams
from exo_p2p.types.chunks import TokenLogprobs

_json = msgspec.json.Encoder()


class CompletionRequest(msgspec.Struct, frozen=True):
    """``POST /v1/completions`` (unknown fields ignored, as OpenAI does)."""

    model: NonEmptyStr
    prompt: str | list[str]
    max_tokens: PositiveTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: str | StopList | None = None
    seed: Seed | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, Any] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    response_format: Any = None
    regex: str | None = None
    grammar: str | None = None
    n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    best_of: Annotated[int, msgspec.Meta(ge=1)] | None = None
    echo: bool | None = None
    suffix: str | None = None
    logprobs: int | None = None


class CompletionChoice(msgspec.Struct, frozen=True):
    text: str
    index: int
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class TextCompletion(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


def completion_params(r: CompletionRequest) -> GenerationParams:
    """``GenerationParams`` of a completion; 400 naming the parameter we cannot honour, or a
    bad or second output format (``response_format``, ``regex``, ``grammar``:
    ``exo_p2p.api.formats``)."""
    refuse_set([
        ("n", r.n is not None and r.n > 1, "only n=1 is supported"),
        ("best_of", r.best_of is not None and r.best_of > 1, "only best_of=1 is supported"),
        ("echo", bool(r.echo), "echoing the prompt is not supported"),
        ("suffix", bool(r.suffix), "insertion (suffix) is not supported"),
    ])
    prompt = r.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ApiError(400, f"prompt must be one string (a list of exactly one), got a list of {len(prompt)}", param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    optional = {
        "max_tokens": r.max_tokens, "temperature": r.temperature, "top_p": r.top_p, "seed": r.seed,
        "top_k": r.top_k, "min_p": r.min_p, "presence_penalty": r.presence_penalty,
        "frequency_penalty": r.frequency_penalty, "repetition_penalty": r.repetition_penalty,
    }
    fields: dict[str, object] = {k: v for k, v in optional.items() if v is not None}
    fields["output_format"] = output_format(openai_response_format(r.response_format), *extensions(r.regex, r.grammar))
    fields["logprobs"] = requested(r.logprobs is not None, r.logprobs, top_param="logprobs")
    return GenerationParams(messages=(), prompt=prompt, stop=stop_strings(r.stop), logit_bias=logit_bias_pairs(r.logit_bias), **fields)  # type: ignore[arg-type]


class CompletionEncoder(msgspec.Struct, frozen=True):
    """``text_completion`` bytes of one completion (``id`` is ``cmpl-<task_id>``)."""

    id: str
    created: int
    model: str
    include_usage: bool = False
    logprobs: bool = False
    """The request asked for log-probabilities (the legacy ``logprobs`` object)."""
    family: str = "openai"
    media_type: str = SSE_MEDIA_TYPE

    def _event(self, text: str, finish_reason: str | None, usage: Usage | None = None, choices: bool = True,
               logprobs: dict[str, Any] | None = None) -> bytes:
        listed = [CompletionChoice(text=text, index=0, finish_reason=finish_reason, logprobs=logprobs)] if choices else []
        return sse(TextCompletion(self.id, "text_completion", self.created, self.model, listed, usage))

    def start(self, prompt_tokens: int | None) -> bytes:
        return b""

    def text(self, delta: str) -> bytes:
        return self._event(delta, None)

    def text_with_logprobs(self, delta: str, logprobs: TokenLogprobs, offset: int) -> bytes:
        """A token's event with its legacy ``logprobs`` (``text_offset`` from ``offset``)."""
        return self._event(delta, None, logprobs=legacy([logprobs], offset))

    def answer(self, turn: Turn, chunk: FinishChunk) -> bytes:
        """The whole ``text_completion``, with the legacy ``logprobs`` when asked for."""
        choice = CompletionChoice(text=turn.text, index=0, finish_reason=openai_finish_reason(chunk.finish_reason),
                                  logprobs=legacy(turn.logprobs) if self.logprobs else None)
        return _json.encode(TextCompletion(self.id, "text_completion", self.created, self.model, [choice], _usage(chunk)))

    def finish(self, chunk: FinishChunk) -> bytes:
        tail = self._event("", openai_finish_reason(chunk.finish_reason))
        if self.include_usage:
            tail += self._event("", None, _usage(chunk), choices=False)
        return tail + DONE

    def error(self, info: ErrorInfo) -> bytes:
        return sse(error_body(info)) + DONE

    def keepalive(self) -> bytes:
        return SSE_KEEPALIVE

    def body(self, text: str, chunk: FinishChunk) -> bytes:
        choice = CompletionChoice(text=text, index=0, finish_reason=openai_finish_reason(chunk.finish_reason))
        return _json.encode(TextCompletion(self.id, "text_completion", self.created, self.model, [choice], _usage(chunk)))


def _usage(chunk: FinishChunk) -> Usage:
    return Usage(chunk.prompt_tokens, chunk.completion_tokens, chunk.prompt_tokens + chunk.completion_tokens, CachedTokens(min(chunk.cached_tokens, chunk.prompt_tokens)))


def completion_job(r: CompletionRequest, ctx: ApiContext) -> GenerationJob:
    params = completion_params(r)
    model_id = ctx.model_id(r.model)
    task_id = new_task_id()
    include_usage = bool(r.stream_options and r.stream_options.include_usage)
    encoder = CompletionEncoder(id=f"cmpl-{task_id}", created=int(time.time()), model=model_id, include_usage=include_usage,
                                logprobs=params.logprobs is not None)
    return GenerationJob(model_id=model_id, params=params, stream=bool(r.stream), encoder=encoder, task_id=task_id)


def routes(ctx: ApiContext) -> list[Route]:
    """``POST /v1/completions``."""

    async def completions(request: Request) -> GenerationResponse:
        return ctx.generate(await ctx.job(completion_job, await ctx.read_json(request, CompletionRequest), ctx))

    return [Route("/v1/completions", completions, methods=["POST"])]
