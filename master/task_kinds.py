"""The master's rules per kind of work (docs/architecture.md#how-to-add-a-kind-of-work): which
models may take a task, when its inputs surely exceed the model's context, and how many tokens
its prefill holds at once (memory admission, ``master.admission``). Pure functions.

An encoder runs on one node: it is small, and its runner has no pipeline or tensor stages
(``split_refusal``); an image model's transformer blocks split as a pipeline (``worker.image``).

A card lists the kinds its model can do (``ModelCard.tasks``, derived from the model's files:
``exo_p2p.types.kinds``); a card from before kinds lists none and generates only. A task for a
kind its model cannot do is refused with a 400 ``unsupported_task`` naming the kinds it can.
"""

from __future__ import annotations

from exo_p2p.types import Embedding, ErrorInfo, ImageGeneration, Instance, ModelCard, Rerank, TextGeneration, WorkTask
from exo_p2p.types.kinds import card_tasks
from master.admission import MAX_BYTES_PER_TOKEN, oversized_prompt, prompt_bytes, prompt_token_bound

def unsupported_task(card: ModelCard, task: WorkTask) -> ErrorInfo | None:
    """None when ``card``'s model can do ``task``'s kind; else the 400 naming what it can."""
    tasks = card_tasks(card)
    if task.task_kind in tasks:
        return None
    message = (f"model {card.model_id!r} cannot do {task.task_kind!r} work; it can: {', '.join(tasks) or 'nothing'}")
    return ErrorInfo(400, message, param="model", code="unsupported_task")


def _pairs(task: Rerank) -> list[int]:
    """Tokens of each (query, document) pair a reranker reads (query + document)."""
    return [len(task.params.query) + len(d) for d in task.params.documents]


def oversized_input(card: ModelCard, task: WorkTask) -> ErrorInfo | None:
    """The 400 for inputs that surely exceed the model's context (``card.context_length``
    tokens), or None. A generation's prompt is bounded from its text (``master.admission``);
    an embedding's inputs and a rerank's query + document pairs are token ids, counted
    exactly (the runner still checks what its model's special tokens add)."""
    context = card.context_length
    if isinstance(task, ImageGeneration):  # and ImageEdits: the prompt is cut at the encoder's tokens
        return None
    if isinstance(task, TextGeneration):
        too_long = oversized_prompt(task.params, context)
        if too_long is None:
            return None
        return ErrorInfo(400, too_long, param="messages", code="context_length_exceeded", context_tokens=context,
                         prompt_tokens=-(-prompt_bytes(task.params) // MAX_BYTES_PER_TOKEN))  # at least this many tokens
    lengths = [len(i) for i in task.params.inputs] if isinstance(task, Embedding) else _pairs(task)
    param = "input" if isinstance(task, Embedding) else "documents"
    longest = max(lengths, default=0)
    if longest <= context:
        return None
    index = lengths.index(longest)
    return ErrorInfo(400, f"{param} {index} has {longest} tokens, more than the model's context of {context} tokens",
                     param=param, code="context_length_exceeded", prompt_tokens=longest, context_tokens=context)


def prefill_tokens(card: ModelCard, task: WorkTask) -> int:
    """An upper bound of the tokens ``task`` prefills at once on its instance, for memory
    admission: a generation's prompt bound (``master.admission.prompt_token_bound``); an
    embedding's longest input and a rerank's longest pair (inputs go through the prefill one
    row each, and hold no KV cache once pooled)."""
    if isinstance(task, TextGeneration):
        return prompt_token_bound(task.params, card.context_length)
    if isinstance(task, ImageGeneration):  # the prompt the text encoder reads, at most its tokens
        return min(len(task.params.prompt.encode()), card.context_length)
    lengths = [len(i) for i in task.params.inputs] if isinstance(task, Embedding) else _pairs(task)
    return min(max(lengths, default=0), card.context_length)


def split_refusal(card: ModelCard, instance: Instance) -> str | None:
    """Why ``instance`` (a placement of ``card``) may not be made: an encoder on more than one
    node. None otherwise (an image model's blocks split as a pipeline: docs/images.md#pipeline;
    its cards have no tensor sharding)."""
    tasks = card_tasks(card)
    if "generate" in tasks or "image" in tasks or len(instance.shards) <= 1:
        return None
    what = "an encoder"
    return (f"model {card.model_id!r} is {what} ({', '.join(card_tasks(card))}): it runs on one node, and no "
            f"single node could hold it (the placement needed {len(instance.shards)}); free memory on a node or "
            "name one with nodes")
