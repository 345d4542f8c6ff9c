"""Chat through a node's OpenAI API: one streamed answer, or an interactive conversation."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from exo_p2p.cli.chat.images import user_content
from exo_p2p.cli.node_api.client import NodeClient, name_nodes_in
from exo_p2p.cli.errors import ApiError, CliError
from exo_p2p.cli.messages import AnswerStats, reworded_unknown_model, stats_line

EMBEDDED_MODEL = "smollm2-135m-instruct"
"""The model every node can serve without downloads (docs/architecture.md#wire-and-storage)."""

REPL_HELP = "type a message; /clear forgets the conversation; /bye or Ctrl-D leaves"


def choose_model(client: NodeClient, model: str | None) -> str:
    """``model`` when given; else the model of the first ready instance; else the embedded
    default ``EMBEDDED_MODEL``."""
    if model:
        return model
    for inst in client.instances():
        if inst.get("status") == "ready" and inst.get("model"):
            return str(inst["model"])
    return EMBEDDED_MODEL


def request_body(
    model: str,
    messages: list[dict],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    response_format: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An OpenAI chat-completion request with only the parameters the user gave (and the
    usage chunk asked for: the token count of the figures line); ``response_format`` from
    ``--json`` / ``--schema`` (``exo_p2p.cli.chat.structured``)."""
    body: dict[str, Any] = {"model": model, "messages": messages, "stream_options": {"include_usage": True}}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if response_format is not None:
        body["response_format"] = response_format
    return body


def length_notice(max_tokens: int | None) -> str:
    """What the CLI says (on stderr) when an answer ended at its length limit."""
    limit = f"of {max_tokens} tokens " if max_tokens else ""
    more = f"--max-tokens {max_tokens * 4}" if max_tokens else "--max-tokens N"
    return f"(the answer was cut at the length limit {limit}— pass {more} for a longer one)"


def stream_answer(
    client: NodeClient,
    body: dict,
    out: IO[str] | None = None,
    note: Callable[[str], None] | None = None,
    *,
    quiet: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Write the answer's text to ``out`` (stdout) as it arrives; end the line; return the
    whole text. When the answer ends at the length limit, ``note`` (stderr) says so and how
    to get more; then, unless ``quiet``, one line of figures (``stats_line``: TTFT, tokens/s,
    finish reason; ``clock`` gives seconds). Errors from the node raise ``CliError``;
    Ctrl-C closes the stream (the node cancels the generation) and propagates."""
    out = out or sys.stdout
    note = note or (lambda text: print(text, file=sys.stderr, flush=True))
    pieces: list[str] = []
    reasons: list[str] = []
    stats = AnswerStats(started=clock())

    def usage(counts: dict) -> None:
        if isinstance(counts.get("completion_tokens"), int):
            stats.completion_tokens = counts["completion_tokens"]

    stream = client.chat_stream(body, on_finish=reasons.append, on_usage=usage)
    try:
        for delta in stream:
            stats.delta(clock())
            pieces.append(delta)
            out.write(delta)
            out.flush()
    finally:
        stream.close()
        if pieces and not pieces[-1].endswith("\n"):
            out.write("\n")
            out.flush()
    if "length" in reasons:
        note(length_notice(body.get("max_tokens")))
    if not quiet:
        stats.finish_reason = reasons[-1] if reasons else None
        note(stats_line(stats))
    return "".join(pieces)


def start_messages(system: str | None) -> list[dict]:
    """A new conversation: just the system message, when there is one."""
    return [{"role": "system", "content": system}] if system else []


def chat_once(
    client: NodeClient,
    model: str,
    prompt: str,
    *,
    system: str | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    quiet: bool = False,
    response_format: dict[str, Any] | None = None,
    images: list[dict[str, Any]] | None = None,
) -> str:
    """Answer one prompt (with ``images``, ``image_url`` parts: ``exo_p2p.cli.chat.images``),
    streamed to stdout; returns the answer; the figures line on
    stderr unless ``quiet``. Raises ``CliError``: exit 2 for an empty or blank prompt (a
    model asked nothing rambles for minutes)."""
    if not prompt.strip():
        raise CliError("the prompt is empty; give a question, or no PROMPT at all to chat interactively", 2)
    messages = start_messages(system) + [{"role": "user", "content": user_content(prompt, images or [])}]
    body = request_body(model, messages, max_tokens=max_tokens, temperature=temperature,
                        response_format=response_format)
    answer = stream_answer(client, body, quiet=quiet)
    if response_format is not None:
        check_json_answer(answer, max_tokens)
    return answer


def check_json_answer(answer: str, max_tokens: int | None) -> None:
    """Raise ``CliError`` (exit 1) when an answer asked for as JSON (``--json`` /
    ``--schema``) is not one whole JSON value, e.g. cut at the length limit: a script reading
    stdout must not take half an object for an answer. The node's grammar makes every whole
    answer valid; only a cut one fails here."""
    try:
        json.loads(answer)
    except ValueError:
        more = f"--max-tokens {max_tokens * 4}" if max_tokens else "a larger --max-tokens"
        raise CliError(f"the answer is not complete JSON (cut before its end); pass {more}", 1) from None


def repl(
    client: NodeClient,
    model: str,
    *,
    system: str | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    quiet: bool = False,
    response_format: dict[str, Any] | None = None,
    read: Callable[[str], str] = input,
    note: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
    images: list[dict[str, Any]] | None = None,
) -> int:
    """Chat until ``/bye``, ``/exit`` or end of input, keeping the conversation; returns the
    number of answers given (each followed by the figures line unless ``quiet``). Ctrl-C during an answer stops that answer (the question is
    forgotten) and returns to the prompt, as does an error the node answers with; Ctrl-C at
    the prompt and an unreachable node propagate."""
    messages = start_messages(system)
    answers = 0
    note(f"chatting with {model} — {REPL_HELP}")
    while True:
        try:
            line = read(">>> ")
        except EOFError:
            return answers
        except KeyboardInterrupt:
            note("")  # leave the terminal on a fresh line
            raise
        text = line.strip()
        if not text:
            continue
        if text in ("/bye", "/exit", "/quit"):
            return answers
        if text == "/clear":
            messages = start_messages(system)
            note("conversation cleared")
            continue
        first = not any(m["role"] == "user" for m in messages)  # images go with the first question
        messages.append({"role": "user", "content": user_content(line, images or []) if first else line})
        body = request_body(model, messages, max_tokens=max_tokens, temperature=temperature,
                            response_format=response_format)
        try:
            answer = stream_answer(client, body, note=note, quiet=quiet)
        except KeyboardInterrupt:
            messages.pop()
            note("(answer interrupted)")
            continue
        except ApiError as e:
            messages.pop()
            note(f"error: {name_nodes_in(reworded_unknown_model(e.message) or e.message if e.status == 404 else e.message)}")
            continue
        messages.append({"role": "assistant", "content": answer})
        answers += 1
