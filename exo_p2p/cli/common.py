"""What every ``exo-p2p`` command shares: the typer ``app``, the global options, the
options client commands take (``--api``, ``--api-key``, ``--json``, ``--nodes``), the
``handled`` wrapper that turns errors into one line, and the client a command talks through.

Importing this module must stay cheap: client commands only talk HTTP, so nothing here (nor
in the command modules) imports py-libp2p, MLX or the node at import time; the commands
that need them import them when they run (``tests/test_cli_imports.py`` bounds the set).
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Optional, TypeVar

import click
import typer
from rich.console import Console

from exo_p2p.cli.node_api import client as client_module
from exo_p2p.cli.node_api.client import NodeClient
from exo_p2p.cli.node_api.endpoint import API_ENV, DEFAULT_API, resolve_api_url
from exo_p2p.cli.errors import ApiError, CliError
from exo_p2p.cli.messages import API_KEY_ENV, reworded_unknown_model


def _help_type(self: Any, ctx: click.Context) -> str | None:
    """What ``--help`` shows after an option: its metavar (PORT, DIR, …), nothing for a flag
    (typer 0.29 shows ``<bool>`` and Python types such as ``<list[Path]>``)."""
    if self.metavar is not None:
        return self.metavar or None
    if getattr(self, "is_flag", False) or getattr(self, "count", False):
        return None
    shown = _typer_display_type(self, ctx) or ""
    return _HELP_TYPES.get(shown, shown.strip("<>"))


_HELP_TYPES = {"<int>": "N", "<int range>": "N", "<float>": "NUMBER", "<float range>": "NUMBER",
               "<str>": "TEXT", "<path>": "PATH", "<list[str]>": "TEXT", "<list[Path]>": "PATH"}
_typer_display_type = typer.core.TyperOption.display_type_rich


typer.core.TyperOption.display_type_rich = _help_type  # type: ignore[method-assign]
typer.core.TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]

app = typer.Typer(
    name="exo-p2p",
    help="Run LLMs across the machines of a home or lab. Start `exo-p2p node` on each machine; "
    "the other commands talk to a node's HTTP API.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def reflow(text: str) -> str:
    """A docstring as help: its paragraphs (split at blank lines) each on one line, so the
    terminal wraps them at its width (this typer keeps the source's line breaks after the
    first paragraph, which left half-empty lines at 80 columns); a paragraph starting with
    ``\\b`` keeps its lines."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n")) for p in paragraphs)


def reflow_help(typer_app: typer.Typer) -> None:
    """Give every command registered on ``typer_app`` (and on the apps added to it) its
    docstring reflowed (``reflow``) as its help, unless it has a help of its own."""
    for info in typer_app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if doc:
            info.help = reflow(doc)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)


@dataclass
class Globals:
    """Options given before the subcommand."""

    api: str | None = None
    api_key: str | None = None


ApiOpt = Annotated[
    Optional[str],
    typer.Option(
        "--api",
        metavar="URL",
        help=f"URL of the node's API (default ${API_ENV}, else {DEFAULT_API}).",
        show_default=False,
    ),
]
ApiKeyOpt = Annotated[
    Optional[str],
    typer.Option(
        "--api-key",
        metavar="KEY",
        help=f"API key for a node started with --api-key (default ${API_KEY_ENV}).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout (for scripts).")]
NodesOpt = Annotated[
    Optional[str],
    typer.Option("--nodes", metavar="NODES", help="Nodes that must take part: ids, unique id prefixes or names, comma-separated."),
]

PLACE_TIMEOUT = 900.0
"""Default seconds ``place`` and ``run`` wait for an instance to be ready."""

F = TypeVar("F", bound=Callable[..., Any])


def handled(fn: F) -> F:
    """Turn ``CliError`` into ``error: <message>`` on stderr and its exit code, and Ctrl-C
    into a quiet exit 130: no command ever shows a traceback for these. Node ids in the
    message are replaced by the nodes' names (``client.name_nodes_in``). A command that
    trips over the shape of a JSON answer (``--api`` names some other JSON service, or a
    node of another version) says so in one line, exit 1; before any answer such an error
    is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CliError as e:
            message = e.message
            if isinstance(e, ApiError) and e.status == 404:  # one wording of an unknown model in every command
                message = reworded_unknown_model(message) or message
            click.echo(f"error: {client_module.name_nodes_in(message)}", err=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except (AttributeError, TypeError, KeyError, IndexError) as e:
            if client_module.answered_by is None:
                raise
            click.echo(f"error: {client_module.answered_by} gave an answer this client does not understand "
                       f"({type(e).__name__}: {e}); is it an exo-p2p node of this version?", err=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def stdout_console() -> Console:
    return Console(soft_wrap=False)


def stderr_console() -> Console:
    """Progress and notes; not wrapped at 80 columns when stderr is not a terminal."""
    return Console(stderr=True, soft_wrap=not sys.stderr.isatty())


def given_api(ctx: typer.Context, api: str | None, api_key: str | None) -> tuple[str | None, str | None]:
    """The ``--api`` URL and ``--api-key`` given to the subcommand, else before it (None:
    neither; the environment and the defaults then apply)."""
    globals_ = ctx.find_object(Globals)
    key = api_key if api_key is not None else (globals_.api_key if globals_ else None)  # "" is an error, not "none"
    return api or (globals_.api if globals_ else None), key


def client_for(ctx: typer.Context, api: str | None, api_key: str | None = None) -> NodeClient:
    """The client of the node the command talks to (``--api``/``--api-key`` of the
    subcommand, then the global ones, then ``$EXO_P2P_API``/``$EXO_P2P_API_KEY``)."""
    url, key = given_api(ctx, api, api_key)
    client = NodeClient(resolve_api_url(url), api_key=key)
    client.on_wait = lambda text: click.echo(text, err=True)
    return client


def model_name(value: str | None) -> str | None:
    """A MODEL argument or option as the node lists models (typer callback): an Ollama store's
    name without its tag means ``:latest`` (``exo_p2p.models.names.canonical_model_name``), so
    ``place``, ``stop`` and ``chat`` of ``ollama:llama3.2`` find ``ollama:llama3.2:latest``."""
    from exo_p2p.models.names import canonical_model_name  # light: no numpy, no MLX

    return None if value is None else canonical_model_name(value)


def split_nodes(nodes: str | None) -> list[str] | None:
    """``--nodes "a, b"`` → ``["a", "b"]``; None when empty."""
    if not nodes:
        return None
    return [n.strip() for n in nodes.split(",") if n.strip()] or None


def node_names(client: NodeClient) -> dict[str, str]:
    """node id → friendly name, for tables (empty when the node list is unavailable)."""
    try:
        return {n["node_id"]: n["friendly_name"] for n in client.nodes() if n.get("friendly_name")}
    except (CliError, KeyError, TypeError):
        return {}


@app.callback()
def root(
    ctx: typer.Context,
    api: Annotated[
        Optional[str],
        typer.Option("--api", envvar=API_ENV, metavar="URL", help=f"URL of the node's API (default {DEFAULT_API}).", show_default=False),
    ] = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Run LLMs across the machines of a home or lab."""
    ctx.obj = Globals(api=api, api_key=api_key)
