"""``exo-p2p chat`` and ``exo-p2p run``: a streamed answer (or an interactive chat) from a
placed model; ``run`` also places the model and, when no node answers, starts one."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console

from exo_p2p.cli.node_api import endpoint
from exo_p2p.cli.chat.session import EMBEDDED_MODEL, chat_once, choose_model, repl
from exo_p2p.cli.node_api.client import NodeClient
from exo_p2p.cli.common import (PLACE_TIMEOUT, ApiKeyOpt, ApiOpt, app, client_for, given_api, handled, model_name,
                                stderr_console)
from exo_p2p.cli.node_api.endpoint import resolve_api_url
from exo_p2p.cli.errors import ApiError, CliError, NodeUnreachable
from exo_p2p.cli.placement import unconfirmed
from exo_p2p.cli.chat.local_node import running_node
from exo_p2p.cli.chat.images import ImageOpt, image_parts
from exo_p2p.cli.chat.structured import JsonAnswerOpt, SchemaOpt, response_format
from exo_p2p.config import default_data_dir

ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", "-m", callback=model_name, help="Model to ask (default: the first ready instance's, else the embedded one)."),
]
MaxTokensOpt = Annotated[Optional[int], typer.Option(min=1, help="Stop after this many tokens.")]
TemperatureOpt = Annotated[
    Optional[float],
    typer.Option(min=0, help="Sampling temperature (0: greedy)."),
]
SystemOpt = Annotated[Optional[str], typer.Option(help="A system message.")]
QuietOpt = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="Leave out the line of figures (TTFT, tokens/s, finish reason) on stderr after each answer."),
]
PromptArg = Annotated[
    Optional[str],
    typer.Argument(metavar="PROMPT", help="Ask this and exit; chat interactively when omitted."),
]
RunDataDirOpt = Annotated[
    Optional[Path],
    typer.Option("--data-dir", help="Data dir of the node started when none answers (default: as `exo-p2p node`)."),
]
ReadyTimeoutOpt = Annotated[float, typer.Option("--timeout", min=0, help="Seconds to wait for the model to be ready.")]
LanOpt = Annotated[
    bool,
    typer.Option("--lan", help="The node started for this command joins the LAN's default cluster (mDNS) instead of staying private."),
]


@app.command()
@handled
def chat(
    ctx: typer.Context,
    prompt: PromptArg = None,
    model: ModelOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None,
    system: SystemOpt = None,
    json_object: JsonAnswerOpt = False,
    schema: SchemaOpt = None,
    quiet: QuietOpt = False,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
    image: ImageOpt = None,
) -> None:
    """Chat with a placed model (--image FILE: about an image, sent with the first question); the answer streams as it is generated, then one line on
    stderr gives the time to the first token, tokens/s and the finish reason (--quiet: not).
    --json or --schema FILE: the answer is JSON (a JSON object, or one that validates against
    the schema), enforced by the node while it decodes."""
    _refuse_empty(prompt)
    fmt = response_format(json_object, schema)
    images = image_parts(image)
    with client_for(ctx, api, api_key) as client:
        chosen = choose_model(client, model)
        params = dict(system=system, max_tokens=max_tokens, temperature=temperature, quiet=quiet,
                      response_format=fmt, images=images)
        if prompt is not None:
            chat_once(client, chosen, prompt, **params)
        else:
            repl(client, chosen, **params)


def ensure_ready_instance(
    client: NodeClient, model: str, timeout: float, console: Console, on_placed: Callable[[str], None] | None = None
) -> dict:
    """A ready instance of ``model``: an existing ready one, else a loading one waited for,
    else a new placement waited for (``on_placed(instance_id)`` is called as soon as it is
    placed, so the caller can undo it however the wait ends). Raises ``CliError`` as
    ``place`` does."""
    listed = client.instances()
    existing = [i for i in listed if i.get("model") == model and i.get("status") != "failed"]
    for inst in existing:
        if inst.get("status") == "ready":
            return inst
    if existing:
        from exo_p2p.cli.placement.waiting import wait_until_ready  # rich.progress: only when waiting
        return wait_until_ready(client, existing[0], timeout=timeout, console=console)
    try:
        inst = client.place(model)
    except ApiError as e:  # placed, but confirmed after the master's answer: go on with it
        if not unconfirmed.is_unconfirmed(e):
            raise
        inst = unconfirmed.late_instance(client, model, {str(i.get("instance_id")) for i in listed}, e)
    if on_placed is not None:
        on_placed(inst["instance_id"])
    console.print(f"placed {model} as instance {inst['instance_id']}")
    from exo_p2p.cli.placement.waiting import wait_until_ready  # rich.progress: only when waiting
    return wait_until_ready(client, inst, timeout=timeout, console=console)


@app.command()
@handled
def run(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", callback=model_name, help="Model id.")] = EMBEDDED_MODEL,
    prompt: PromptArg = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None,
    system: SystemOpt = None,
    json_object: JsonAnswerOpt = False,
    schema: SchemaOpt = None,
    data_dir: RunDataDirOpt = None,
    timeout: ReadyTimeoutOpt = PLACE_TIMEOUT,
    lan: LanOpt = False,
    quiet: QuietOpt = False,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Answer PROMPT with MODEL (or chat), like `ollama run`.

    Uses the node at --api (or $EXO_P2P_API) and fails when nothing answers there; without
    either, uses the local node at the default address, else runs a private node here for
    this command (its own cluster name, no mDNS, loopback only; --lan makes it join the
    LAN's default cluster instead).

    Places MODEL first when it is not placed yet; stops what it started on exit: a node it
    started, and the instance it placed on that node (so a later run or node does not bring
    it back). On a node that was already running, a placement it made stays (like any
    `place`) and it says so. After the answer, one line on stderr gives the time to the
    first token, tokens/s and the finish reason (--quiet: not). --json and --schema FILE as
    for `chat`.
    """
    _refuse_empty(prompt)
    fmt = response_format(json_object, schema)
    explicit, key = given_api(ctx, api, api_key)
    api_url = resolve_api_url(explicit, endpoint.DEFAULT_API)
    console = stderr_console()
    with ExitStack() as stack:
        api_url, started_node = node_for_run(stack, api_url, key, explicit=bool(explicit), data_dir=data_dir, lan=lan,
                                             console=console)
        client = stack.enter_context(NodeClient(api_url, api_key=key))

        def placed(instance_id: str) -> None:
            if started_node:
                stack.callback(_delete_quietly, client, instance_id)
            else:
                stack.callback(
                    console.print, f"instance {instance_id} stays placed; remove it with `exo-p2p delete {instance_id}`"
                )

        ensure_ready_instance(client, model, timeout, console, on_placed=placed)
        params = dict(system=system, max_tokens=max_tokens, temperature=temperature, quiet=quiet,
                      response_format=fmt)
        if prompt is not None:
            chat_once(client, model, prompt, **params)
        else:
            repl(client, model, **params)


def node_for_run(stack: ExitStack, api_url: str, key: str | None, *, explicit: bool, data_dir: Path | None, lan: bool,
                 console: Console) -> tuple[str, bool]:
    """The API URL ``run`` talks to and whether ``run`` started its node: ``api_url`` when a
    node answers there; else a node started for this command in ``stack`` (stopped when it
    closes; private unless ``lan``; data dir ``data_dir`` or the default). Raises
    ``NodeUnreachable`` when nothing answers at an address the user gave (``explicit``)."""
    probe = stack.enter_context(NodeClient(api_url, api_key=key))
    if probe.ping():
        return api_url, False
    if explicit:
        raise NodeUnreachable(
            f"nothing answers at {api_url} (the --api given); start a node there, "
            "or leave out --api to run a node for this command"
        )
    directory = (data_dir or default_data_dir()).expanduser()
    where = "joining the LAN's default cluster" if lan else "private: loopback only, no mDNS"
    console.print(
        f"no node answers at {api_url}; starting one for this command ({where}; data dir {directory})"
    )
    return stack.enter_context(running_node(directory, console, private=not lan)), True


def _refuse_empty(prompt: str | None) -> None:
    """A given prompt must say something (a model asked nothing rambles for minutes)."""
    if prompt is not None and not prompt.strip():
        raise CliError("the prompt is empty; give a question, or no PROMPT at all to chat interactively", 2)


def _delete_quietly(client: NodeClient, instance_id: str) -> None:
    try:
        client.delete_instance(instance_id)
    except Exception:  # noqa: BLE001 - best effort on the way out; the node stops next
        pass
