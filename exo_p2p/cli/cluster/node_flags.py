"""The flags of ``exo-p2p node``, generated from the one table of node settings
(``exo_p2p.settings.table.SETTINGS``), and the values the command line, the environment and
the data dir's ``config.toml`` give them, made into a ``NodeConfig``.

``node_flags`` gives the ``node`` command the signature typer reads its options from: one
keyword parameter per setting, its ``typer.Option`` made from the ``Setting`` (type, bounds,
environment variable, metavar, help with the default, help panel). A value neither given on
the command line nor in the environment comes from the data dir's ``config.toml``
(``node_flag_values``), keyed by the flag's name. ``node_config`` hands the values to
``exo_p2p.cli.cluster.node_config.build_node_config``, which applies them with no code of their own.
Adding a flag: docs/architecture.md ("How to add a node flag").
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Callable, Optional, TypeVar

import click
import typer
from typer._click.core import ParameterSource  # typer ships its own click
from typer.core import TyperCommand

from exo_p2p.cli.errors import CliError
from exo_p2p.cli.cluster.node_config import NODE_CONFIG_FILE, build_node_config, read_node_config_file
from exo_p2p.config import NodeConfig, default_data_dir
from exo_p2p.settings.setting import Setting
from exo_p2p.settings.table import PANELS, SETTINGS

HELP_PANELS: dict[str, tuple[str, ...]] = {
    panel: tuple(s.flag for s in SETTINGS.values() if s.panel == panel) for panel in PANELS}
"""The flags of each group ``exo-p2p node --help`` shows (``Setting.panel``), in table order."""
ALL_ONLY = frozenset(s.flag for s in SETTINGS.values() if s.help_all_only)
"""The flags only ``node --help-all`` shows (``NodeCommand``)."""


def node_option(setting: Setting) -> Any:
    """The ``typer.Option`` of ``setting``: its environment variable (shown only when it is
    not ``EXO_P2P_`` and the flag's name: the command's help says that rule once), metavar,
    help with the default, bounds (unless not ``bounds_in_help``: then only
    ``exo_p2p.settings.apply`` checks them) and help panel."""
    bounds = {"min": setting.min, "max": setting.max} if setting.bounds_in_help else {}
    return typer.Option(setting.flag, envvar=setting.env, metavar=setting.metavar, help=setting.cli_help(),
                        hidden=setting.hidden, show_envvar=setting.env not in (None, setting.derived_env),
                        rich_help_panel=setting.panel, **bounds)


def node_parameter(setting: Setting) -> inspect.Parameter:
    """The keyword parameter of the ``node`` command for ``setting``: a switch is a ``bool``
    (False when not given), any other an optional value of its type (a list when repeatable),
    None when not given."""
    if setting.switch:
        kind, default = bool, False
    else:
        kind, default = Optional[list[setting.type]] if setting.repeatable else Optional[setting.type], None
    return inspect.Parameter(setting.param, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, node_option(setting)])


class NodeCommand(TyperCommand):
    """``exo-p2p node``'s command: ``--help`` leaves out the flags of the groups marked
    ``--help-all`` (``ALL_ONLY``); ``--help-all`` (``show_all_help``) shows every one."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if ctx.meta.get(HELP_ALL_KEY):
            return super().format_help(ctx, formatter)
        all_only = {s.flag for s in SETTINGS.values() if s.help_all_only}
        advanced = [p for p in self.get_params(ctx) if not p.hidden and set(p.opts) & all_only]
        for param in advanced:
            param.hidden = True
        try:
            return super().format_help(ctx, formatter)
        finally:
            for param in advanced:
                param.hidden = False


HELP_ALL_KEY = "exo_p2p.help_all"


def show_all_help(ctx: typer.Context, value: bool) -> None:
    """``--help-all``'s callback: print the help with every flag and exit."""
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL_KEY] = True
        typer.echo(ctx.get_help())
        raise typer.Exit()


HELP_ALL = inspect.Parameter("help_all", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
    bool, typer.Option("--help-all", is_eager=True, callback=show_all_help,
                       help="Show every flag, also those of the groups --help leaves out.")])

F = TypeVar("F", bound=Callable[..., Any])


def node_flags(fn: F) -> F:
    """Give the command ``fn(ctx, **flags)`` the signature typer makes its options from: its
    context, one keyword parameter per setting (``node_parameter``) in table order, then
    ``--help-all``. ``fn`` gets every flag's value by ``Setting.param``, and ``help_all``."""
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    params = [ctx, *(node_parameter(s) for s in SETTINGS.values()), HELP_ALL]
    fn.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    return fn


def node_flag_values(ctx: typer.Context) -> dict[str, Any]:
    """The ``node`` command's flag values by parameter name, with the data dir's
    ``config.toml`` filling in every flag the command line and environment left at its
    default. Raises ``CliError`` (exit 2) for an unreadable file, an unknown key or a bad
    value (naming the file and the key)."""
    values = dict(ctx.params)
    data_dir = (values.get("data_dir") or default_data_dir()).expanduser()
    path = data_dir / NODE_CONFIG_FILE
    params = {p.name: p for p in ctx.command.params}
    by_key = {s.key: s for s in SETTINGS.values() if s.key}
    for key, raw in read_node_config_file(path).items():
        if key.replace("_", "-") == "data-dir":
            raise CliError(f"{path}: data-dir cannot be set in the data dir's own file", 2)
        setting = by_key.get(key.replace("_", "-"))
        if setting is None:
            raise CliError(f"{path}: unknown setting {key!r} (keys are `exo-p2p node` flag names, e.g. api-port)", 2)
        param = params[setting.param]
        if ctx.get_parameter_source(setting.param) not in (ParameterSource.DEFAULT, None):
            continue  # the command line or the environment wins
        if setting.repeatable and not isinstance(raw, list):
            raw = [raw]
        try:
            values[setting.param] = param.process_value(ctx, raw)
        except (click.BadParameter, typer.BadParameter) as e:
            raise CliError(f"{path}: {key}: {e.message}", 2) from None
    return values


def node_config(values: dict[str, Any]) -> NodeConfig:
    """The ``NodeConfig`` of the flag values ``values`` (``node_flag_values``, by parameter
    name): each setting given (not None, not False, not empty) to its ``build_node_config``
    keyword, a ``--no-X`` flag given as ``X=False``. Raises ``CliError`` (exit 2) for a bad
    value, as ``build_node_config`` does."""
    given = {}
    for setting in SETTINGS.values():
        value = values.get(setting.param)
        if value is not None and value is not False and value != [] and value != ():
            given[setting.keyword] = (not value) if setting.inverted else value
    return build_node_config(**given)

