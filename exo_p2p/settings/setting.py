"""What one setting of ``exo-p2p node`` is (``Setting``), and its default in words.

A ``Setting`` is the whole declaration of one flag: everything the ``node`` command's option
(``exo_p2p.cli.cluster.node_flags``), the value's checks (``exo_p2p.settings.apply``) and
docs/configuration.md (``exo_p2p.settings.docs``) need. Defaults are never written on a setting:
``default_of`` reads them from ``NodeConfig`` (``exo_p2p.config``), and a flag without a field
has no default beyond "not given".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import msgspec

from exo_p2p.config import NodeConfig

ENV_PREFIX = "EXO_P2P_"
ALL_ONLY_MARK = "(--help-all)"
"""The end of the name of a help panel that ``node --help`` leaves out (``node --help-all`` shows it)."""


@dataclass(frozen=True)
class Setting:
    """One flag of ``exo-p2p node``.

    ``kind``: its type or unit in words (the docs add a lower bound: ``kind_text``); ``type``: the type of its value on the
    command line (``str``, ``int``, ``Path``; ``bool``: a flag without a value, False when not
    given), a list of them when ``repeatable``; ``min``/``max``: bounds of an ``int`` (shown by
    ``--help``); ``choices``: the values it takes; ``check``: turns the value given (after the
    type, before the bounds and choices) into its field's value, or raises ``ValueError`` with
    the reason; ``panel``: its group in ``node --help`` (None only for a hidden flag).
    ``field``: the ``NodeConfig`` field it fills, a dotted path for a field of a record in it
    (``engine.max_batch``: ``NodeConfig.engine.max_batch``; None: it fills none, a rule of
    ``exo_p2p.cli.cluster.node_config`` reads it); two settings may fill one list field (both add to it);
    ``inverted``: the flag sets the field to False (``--no-mdns`` → ``mdns``);
    ``when_unset``: what the node does when a None default is left, in words;
    ``env``, ``key``, ``param`` and ``keyword`` are derived from the flag unless given;
    ``""`` means "none"."""

    flag: str
    kind: str
    help: str
    field: str | None = None
    metavar: str | None = None
    when_unset: str | None = None
    repeatable: bool = False
    inverted: bool = False
    hidden: bool = False
    env_name: str | None = None
    key_name: str | None = None
    type: type = str
    min: int | None = None
    max: int | None = None
    bounds_in_help: bool = True
    choices: tuple[str, ...] = ()
    check: Callable[[Any], Any] | None = None
    panel: str | None = None
    keyword_name: str | None = None

    @property
    def env(self) -> str | None:
        """The environment variable (None: none)."""
        if self.env_name is not None:
            return self.env_name or None
        return None if self.hidden else self.derived_env

    @property
    def derived_env(self) -> str:
        """``EXO_P2P_`` and the flag's name (``--api-port``: ``EXO_P2P_API_PORT``)."""
        return ENV_PREFIX + self.flag[2:].upper().replace("-", "_")

    @property
    def key(self) -> str | None:
        """The ``config.toml`` key (None: not settable there)."""
        if self.key_name is not None:
            return self.key_name or None
        return None if self.hidden else self.flag[2:]

    @property
    def param(self) -> str:
        """The name of the ``node`` command's parameter (``--no-mdns``: ``no_mdns``)."""
        return self.flag[2:].replace("-", "_")

    @property
    def keyword(self) -> str:
        """The keyword of ``build_node_config`` (``exo_p2p.cli.cluster.node_config``): the field's last
        name (``engine.max_batch``: ``max_batch``), else the parameter's."""
        if self.keyword_name:
            return self.keyword_name
        return self.field.rsplit(".", 1)[-1] if self.field else self.param

    @property
    def switch(self) -> bool:
        """A flag without a value (``--offline``)."""
        return self.type is bool

    @property
    def help_all_only(self) -> bool:
        """Shown only by ``node --help-all``."""
        return self.panel is not None and self.panel.endswith(ALL_ONLY_MARK)

    @property
    def kind_text(self) -> str:
        """``kind`` with a lower bound alone (``count (≥ 1)``); a range of both bounds is the
        type's (a port, a 32-bit number) and ``kind`` says it."""
        return f"{self.kind} (≥ {self.min})" if self.min is not None and self.max is None else self.kind

    def cli_help(self) -> str:
        """The help ``exo-p2p node --help`` shows: the text and the default."""
        shown = default_text(self, code=False)
        return f"{self.help} (default: {shown})." if shown not in ("none", "off") else f"{self.help}."


@dataclass(frozen=True)
class EnvVar:
    """An environment variable the code reads that is not only a flag's."""

    name: str
    read_by: str
    help: str


def field_default(path: str) -> Any:
    """The default of the ``NodeConfig`` field at ``path`` (``msgspec.NODEFAULT`` when it has
    none): a field's name, or a dotted path into a record field's default
    (``engine.max_batch``: the ``max_batch`` of ``NodeConfig.engine``'s default)."""
    name, *rest = path.split(".")
    f = _node_config_fields().get(name)
    if f is None:
        raise KeyError(f"NodeConfig has no field {path!r}")
    value = f.default_factory() if f.default_factory is not msgspec.NODEFAULT else f.default
    for part in rest:
        if value is msgspec.NODEFAULT or not hasattr(value, part):
            raise KeyError(f"NodeConfig has no field {path!r}")
        value = getattr(value, part)
    return value


@functools.cache
def _node_config_fields() -> dict[str, msgspec.structs.FieldInfo]:
    """``NodeConfig``'s fields by name, read once: ``msgspec.structs.fields`` resolves the
    type hints on every call (~0.3 ms each, 14 ms of CPU for ``node``'s 46 flags, which every
    client command builds when the CLI starts)."""
    return {f.name: f for f in msgspec.structs.fields(NodeConfig)}


def default_of(setting: Setting) -> Any:
    """The value a setting has when it is not given: from its ``NodeConfig`` field, negated
    for an inverted flag; None for a flag without a field or a field without a default."""
    if setting.field is None:
        return None
    value = field_default(setting.field)
    if value is msgspec.NODEFAULT:
        return None
    return (not value) if setting.inverted else value


def show_value(value: Any) -> str:
    """A default as the docs and ``--help`` show it."""
    if value is None or value == [] or value == {}:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, Path):
        return str(value)
    return str(value)


def default_text(setting: Setting, *, code: bool = True) -> str:
    """The default of ``setting`` in words: its value, or what happens when it is unset;
    ``code`` puts a value in backticks (Markdown)."""
    value = default_of(setting)
    if value in (None, [], {}) and setting.when_unset:
        return setting.when_unset
    shown = show_value(value)
    return f"`{shown}`" if code and shown not in ("none", "off", "on") else shown
