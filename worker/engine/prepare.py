"""Preparing a task into a ``Sequence``: tokens, checks and state, no model work.

``prepare`` applies the chat template (or tokenizes a raw ``prompt`` as is: no template
needed), checks the request against the model, and makes the sequence's sampler,
detokenizer and stop matcher; a request that cannot run gets an ``ErrorChunk`` (HTTP 400)
before any model work: the model has no chat template, the template fails, the prompt does
not fit the context, a logit bias names a token outside the vocabulary, or a resume cannot
fit.

Context rule (documented choice): a prompt of N tokens needs N < context; otherwise 400
"prompt is N tokens but the model's context is M tokens". When N + max_tokens exceeds the
context, max_tokens is clamped to context − N and generation ends with finish_reason
"length" there; no max_tokens (None) means until the model stops or the context is full.

Resuming (``exo_p2p.api.generation.resume``): ``resume_tokens`` (what an earlier task of the request
generated and sent) are appended to the prompt (they count against the context like the
prompt), replayed through the detokenizer and the stop matcher without output, and count as
completion tokens; the sampler starts at their position, so the continuation equals the
uninterrupted run.

Structured output (``worker/engine/answer/constraint.py``): a request with an ``output_format`` gets
its row's grammar from the runner's ``Grammars``; a format that cannot be built is a 400
naming ``response_format`` with llguidance's message; a resumed request's tokens are replayed
into it (a resume that does not fit its format is a 400 too).
"""

from __future__ import annotations

import mlx.core as mx
import msgspec

from exo_p2p.content.output_format import FormatError
from exo_p2p.content.system_turns import messages_for_template
from exo_p2p.types.chunks import ErrorChunk
from exo_p2p.types.common import ErrorInfo, TaskId
from exo_p2p.types.tasks import MAX_TOP_LOGPROBS, GenerationParams
from worker.engine.answer.constraint import ConstraintError, Grammars, inside_think
from worker.engine.loading.loader import LoadedModel
from worker.engine.sampling import Sampler, seed_for
from worker.engine.sequence import Sequence
from worker.engine.answer.stop import StopMatcher
from worker.engine.think_budget import ThinkBudget, end_marker_ids
from worker.engine.answer.tools import output_parser, render_kwargs, tool_grammar


def error_chunk(task_id: TaskId, status: int, message: str, *, param: str | None = None,
                code: str | None = None) -> ErrorChunk:
    """An ``ErrorChunk`` of HTTP ``status`` (< 500: ``invalid_request_error``, else
    ``server_error``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return ErrorChunk(task_id=task_id, error=ErrorInfo(status=status, message=message, type=kind,
                                                       param=param, code=code))


def failure_chunk(task_id: TaskId, exc: Exception) -> ErrorChunk:
    """The ``ErrorChunk`` of a sequence that failed while it decoded: a 400 naming the format
    when its matcher failed (a format past llguidance's limits on some step), else a 500."""
    if isinstance(exc, ConstraintError):
        return error_chunk(task_id, 400, f"invalid output format: {exc}"[:800], param="response_format",
                           code="invalid_format")
    return error_chunk(task_id, 500, f"generation failed: {exc!r}")


def validate_prompt(prompt_tokens: int, max_tokens: int | None, context_length: int) -> str | None:
    """The context rule: None when a prompt of ``prompt_tokens`` may run, else the 400
    message. ``max_tokens`` beyond what is left is clamped, not an error (None: no limit)."""
    if prompt_tokens >= context_length:
        return f"prompt is {prompt_tokens} tokens but the model's context is {context_length} tokens"
    if prompt_tokens < 1:
        return "the prompt is empty"
    if max_tokens is not None and max_tokens < 1:
        return f"max_tokens must be at least 1, not {max_tokens}"
    return None


def vocab_size(loaded: LoadedModel) -> int:
    """Rows of the model's output: the token ids a logit bias may name."""
    size = getattr(getattr(loaded.model, "args", None), "vocab_size", None)
    return int(size) if size else len(loaded.tokenizer.get_vocab())


def prompt_ids(task_id: TaskId, params: GenerationParams, loaded: LoadedModel,
               model_id: str) -> list[int] | ErrorChunk:
    """The prompt's token ids: the raw ``prompt`` tokenized, else the messages through the
    chat template with the generation prompt (late system messages as
    ``exo_p2p.content.system_turns`` says); an ``ErrorChunk`` (400) when there is no template or it
    fails."""
    tok = loaded.tokenizer
    if params.prompt is not None:
        return list(tok.encode(params.prompt))
    if not tok.has_chat_template:
        return error_chunk(task_id, 400, f"model {model_id} has no chat template", param="messages",
                           code="no_chat_template")
    messages, kwargs = render_kwargs(params, tok)
    try:
        messages = messages_for_template(
            lambda ms: tok.apply_chat_template(ms, add_generation_prompt=True, tokenize=False, **kwargs), messages)
        return list(tok.apply_chat_template(messages, add_generation_prompt=True, **kwargs))
    except Exception as e:  # noqa: BLE001 - a template error is the request's fault
        return error_chunk(task_id, 400, f"the chat template of model {model_id} failed: {e}", param="messages")


def check(task_id: TaskId, params: GenerationParams, ids: list[int], loaded: LoadedModel,
          model_id: str) -> ErrorChunk | None:
    """The 400 for a request of prompt ``ids`` that cannot run on ``loaded`` (see the module
    docstring), or None."""
    if problem := validate_prompt(len(ids), params.max_tokens, loaded.context_length):
        if "context" not in problem:
            return error_chunk(task_id, 400, problem, param="max_tokens")
        chunk = error_chunk(task_id, 400, problem, param="messages", code="context_length_exceeded")
        sizes = msgspec.structs.replace(chunk.error, prompt_tokens=len(ids), context_tokens=loaded.context_length)
        return msgspec.structs.replace(chunk, error=sizes)
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_TOP_LOGPROBS:
        return error_chunk(task_id, 400, f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, not {params.logprobs}",
                           param="top_logprobs")
    if params.thinking_budget is not None and params.thinking_budget < 1:
        return error_chunk(task_id, 400, f"a thinking budget must be at least 1 token, not {params.thinking_budget}",
                           param="thinking.budget_tokens")
    if params.temperature < 0:
        return error_chunk(task_id, 400, f"temperature must be >= 0, not {params.temperature}", param="temperature")
    vocab = vocab_size(loaded) if params.logit_bias else 0
    for token_id, _bias in params.logit_bias:
        if not 0 <= token_id < vocab:
            return error_chunk(task_id, 400, f"logit_bias token id {token_id} is not in the vocabulary of model "
                               f"{model_id} (0..{vocab - 1})", param="logit_bias")
    max_new = max_new_tokens(params, len(ids), loaded.context_length)
    resumed = params.resume_tokens
    if resumed and (len(resumed) > max_new or not all(isinstance(t, int) and t >= 0 for t in resumed)):
        return error_chunk(task_id, 400, f"cannot resume after {len(resumed)} tokens: at most {max_new} "
                           "completion tokens fit (max_tokens or the context)", param="resume_tokens")
    return None


def max_new_tokens(params: GenerationParams, prompt_tokens: int, context_length: int) -> int:
    """Completion tokens a request may generate: ``max_tokens`` clamped to what the context
    leaves after the prompt (all of it when ``max_tokens`` is None)."""
    left = context_length - prompt_tokens
    return left if params.max_tokens is None else min(params.max_tokens, left)


def think_markers(loaded: LoadedModel) -> tuple[int, int] | None:
    """The model's think-start and think-end token ids when its tokenizer has single-token
    think markers (mlx-lm's ``TokenizerWrapper.has_thinking``), else None."""
    tok = loaded.tokenizer
    try:
        if getattr(tok, "has_thinking", False):
            start, end = tok.think_start_id, tok.think_end_id
            if isinstance(start, int) and isinstance(end, int):
                return start, end
    except ValueError:  # multi-token markers
        pass
    return None


def new_grammars(loaded: LoadedModel) -> Grammars:
    """The runner's ``Grammars`` for ``loaded`` (its tokenizer is built in the background)."""
    return Grammars(loaded.tokenizer, vocab_size(loaded), sorted(loaded.eos_token_ids), think_markers(loaded))


def grammars_for(params: GenerationParams, grammars: Grammars | None, loaded: LoadedModel) -> Grammars | None:
    """``grammars``, or a new ``Grammars`` when it is None and ``params`` will need one (an
    output format or tools): its tokenizer is built in the background meanwhile."""
    if grammars is None and (params.output_format is not None or params.tools):
        return new_grammars(loaded)
    return grammars


def prepare(task_id: TaskId, params: GenerationParams, loaded: LoadedModel, *, model_id: str,
            submitted_at: float, grammars: Grammars | None = None, ids: list[int] | None = None) -> Sequence | ErrorChunk:
    """The ``Sequence`` of a request (no KV cache yet: the engine gives it one when it
    starts), or the ``ErrorChunk`` it ends with at once. ``submitted_at``: seconds of the
    engine's clock; ``grammars``: the runner's (needed by a request with an output format);
    ``ids``: the prompt's token ids when made elsewhere (a vision row), else rendered here."""
    ids = prompt_ids(task_id, params, loaded, model_id) if ids is None else ids
    if isinstance(ids, ErrorChunk):
        return ids
    if problem := check(task_id, params, ids, loaded, model_id):
        return problem
    resumed = list(params.resume_tokens)
    prompt = mx.array(ids + resumed, dtype=mx.int32)
    seq = Sequence(
        task_id=task_id, params=params, submitted_at=submitted_at, prompt=prompt,
        max_new=max_new_tokens(params, len(ids), loaded.context_length),
        sampler=Sampler(params, seed_for(params.origin_task_id or task_id, params.seed), prompt=prompt),
        detokenizer=loaded.tokenizer.detokenizer, stops=StopMatcher(params.stop),
        eos=frozenset(loaded.eos_token_ids), resumed=len(resumed), completion_tokens=len(resumed),
    )
    try:
        fmt = tool_grammar(params, loaded.tokenizer) or params.output_format
    except FormatError as e:
        return error_chunk(task_id, 400, f"invalid output format: {e}", param="response_format", code="invalid_format")
    if fmt is not None:
        try:
            seq.constraint = (grammars or new_grammars(loaded)).constraint(fmt, ids)
            seq.sampler.constrained = True
            if params.thinking is False:  # thinking turned off: no think block opens before the format
                seq.constraint.think = None
        except FormatError as e:
            return error_chunk(task_id, 400, f"invalid output format: {e}", param="response_format",
                               code="invalid_format")
    seq.parser = output_parser(params, loaded.tokenizer, thinking=inside_think(ids, think_markers(loaded)))
    attach_extras(seq, params, loaded)
    try:
        seq.replay(resumed)
    except ConstraintError as e:
        return error_chunk(task_id, 400, f"cannot resume: the tokens already sent do not fit the output format ({e})",
                           param="resume_tokens")
    if seq.budget is not None:
        seq.budget.start(seq.sampler, seq.parser is not None and seq.parser.state == "reasoning")
    return seq


def attach_extras(seq: Sequence, params: GenerationParams, loaded: LoadedModel) -> None:
    """Give ``seq`` what its logprobs and thinking budget need: a token's text and the
    alternatives clamped to the vocabulary (``token_logprobs``); the budget when the model
    has a think block to end (``think_budget``; a model without one ignores it)."""
    tok = loaded.tokenizer
    if params.logprobs is not None:
        seq.sampler.top_logprobs = min(params.logprobs, vocab_size(loaded))
        seq.token_text = lambda i: tok.decode([i])
    if params.thinking_budget is not None and seq.parser is not None and seq.parser.markers.think_end:
        markers = think_markers(loaded)
        end = end_marker_ids(tok, seq.parser.markers.think_end, None if markers is None else markers[1])
        if end:
            seq.budget = ThinkBudget(params.thinking_budget, end)
