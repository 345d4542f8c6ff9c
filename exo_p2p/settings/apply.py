"""Setting values into ``NodeConfig``, the same way for every setting (``exo_p2p.settings.table``).

``field_values`` takes the values given, by ``Setting.keyword`` in the field's sense (a
``--no-X`` flag given is ``X=False``), and makes each its field's value: the type (a ``Path``
with ``~`` expanded), the setting's ``check``, its bounds, its choices; a value for a list field
another setting fills too is added to it. ``node_config`` builds the ``NodeConfig`` from them:
a dotted field (``engine.max_batch``) replaces that field of the record's default, so the engine
settings the runners get are set like any other field. Raises ``SettingError`` naming the flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from exo_p2p.config import NodeConfig
from exo_p2p.settings.setting import Setting, field_default
from exo_p2p.settings.table import SETTINGS

class SettingError(ValueError):
    """A value a setting refuses; the text names the flag (``--max-batch must be ≥ 1, got 0``)."""


def _typed(setting: Setting, value: Any) -> Any:
    """``value`` as the setting's type: a ``Path`` with ``~`` expanded, a list for a repeatable
    flag; any other type is the command line's business (click converted it)."""
    if setting.repeatable:
        items = [value] if isinstance(value, (str, Path)) else list(value)
        return [Path(v).expanduser() for v in items] if setting.type is Path else items
    return Path(value).expanduser() if setting.type is Path else value


def checked(setting: Setting, value: Any) -> Any:
    """The field's value of ``value`` given for ``setting``: typed, then its check, bounds and
    choices. Raises ``SettingError`` with the flag and the reason."""
    value = _typed(setting, value)
    if setting.check is not None:
        try:
            value = setting.check(value)
        except ValueError as e:
            text = str(e)
            joined = " " if text.startswith(("must ", "takes ")) else ": "
            raise SettingError(f"{setting.flag}{joined}{text}") from None
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = setting.min, setting.max
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = (f"between {low} and {high}" if low is not None and high is not None
                      else f"≥ {low}" if low is not None else f"≤ {high}")
            raise SettingError(f"{setting.flag} must be {bounds}, got {value}")
    if setting.choices and value not in setting.choices:
        raise SettingError(f"{setting.flag} must be one of {', '.join(setting.choices)}, got {value!r}")
    return value


def field_values(given: dict[str, Any]) -> dict[str, Any]:
    """``{field path: value}`` of the values ``given`` by keyword, checked in table order; a
    value None is not given; a switch's value is the field's (``mdns=False``). Raises
    ``SettingError`` for a bad value, ``TypeError`` for a keyword no setting has."""
    unknown = sorted(set(given) - {s.keyword for s in SETTINGS.values()})
    if unknown:
        raise TypeError(f"no node setting has the keyword {unknown[0]!r}")
    fields: dict[str, Any] = {}
    for setting in SETTINGS.values():
        value = given.get(setting.keyword)
        if value is None:
            continue
        value = value if setting.switch else checked(setting, value)
        if setting.field is None:
            continue  # read by a rule of its own (exo_p2p.cli.cluster.node_config)
        if isinstance(value, list) and isinstance(fields.get(setting.field), list):
            value = list(dict.fromkeys([*fields[setting.field], *value]))
        fields[setting.field] = value
    return fields


def node_config(fields: dict[str, Any]) -> NodeConfig:
    """The ``NodeConfig`` of ``{field path: value}`` (``field_values``; ``data_dir`` is
    required); a field not among them keeps its default, as does every field of a record not
    named (``engine.max_batch`` leaves ``engine.prefill_chunk_size`` at its default)."""
    top: dict[str, Any] = {}
    records: dict[str, dict[str, Any]] = {}
    for path, value in fields.items():
        name, dot, rest = path.partition(".")
        if dot:
            records.setdefault(name, {})[rest] = value
        else:
            top[name] = value
    for name, parts in records.items():
        top[name] = msgspec.structs.replace(top.get(name, field_default(name)), **parts)
    return NodeConfig(**top)
