"""docs/configuration.md against the code: the page is what ``exo_p2p.settings.docs`` renders,
the table has exactly the options of ``exo-p2p node``, every default the page shows is the
code's (``NodeConfig`` or the click parameter), and every ``EXO_P2P_*`` variable the product
code names is in the page's environment table. Pure: no process, no socket."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import msgspec
import pytest
import typer.main

from exo_p2p.settings import table as settings_table
from exo_p2p.cli.main import app  # at collection: its libraries' imports run ldconfig (a process)
from exo_p2p.config import NodeConfig
from exo_p2p.settings.docs import GENERATE_COMMAND, render_configuration
from exo_p2p.settings.setting import show_value
from exo_p2p.settings.table import ENVIRONMENT, SETTINGS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
PRODUCT = ("exo_p2p", "master", "worker")


def node_params() -> dict[str, object]:
    """The options of the click command behind ``exo-p2p node``, by their long flag (not
    ``--help`` and ``--help-all``, which are no settings)."""
    command = typer.main.get_command(app).commands["node"]  # type: ignore[attr-defined]
    params = {}
    for param in command.params:
        longs = [o for o in param.opts if o.startswith("--")]
        if param.name not in ("help", "help_all") and longs:
            params[longs[0]] = param
    return params


def page_rows(section: str) -> dict[str, list[str]]:
    """The table rows under ``## section`` of the page, by their first cell without backticks
    (a flag's metavar dropped)."""
    text = PAGE.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if cells and cells[0].startswith("`"):
            rows[cells[0].strip("`").split(" ")[0]] = cells
    return rows


def test_page_is_the_generated_text():
    assert PAGE.read_text() == render_configuration(), (
        f"docs/configuration.md differs from the table of node settings: run `{GENERATE_COMMAND}`")


def test_every_option_of_the_node_command_has_one_entry_and_back():
    params = node_params()
    assert set(params) == set(SETTINGS), (
        f"options without an entry in exo_p2p/settings/table.py: {sorted(set(params) - set(SETTINGS))}; "
        f"entries without an option: {sorted(set(SETTINGS) - set(params))}")
    for flag, param in params.items():
        setting = SETTINGS[flag]
        assert param.envvar == setting.env, flag
        assert bool(getattr(param, "hidden", False)) == setting.hidden, flag
        assert param.help == setting.cli_help(), flag
        if setting.key is not None:  # config.toml keys are read as parameter names
            assert setting.key.replace("-", "_") == param.name, flag
    fields = {f.name for f in msgspec.structs.fields(NodeConfig)}
    for s in SETTINGS.values():
        if s.field:  # a field, or a dotted path into a record field (engine.max_batch)
            assert s.field.split(".")[0] in fields, f"{s.flag} names no NodeConfig field: {s.field}"
            config_value(s.field)  # the path resolves on a NodeConfig


def config_value(path: str) -> object:
    """The value at ``path`` (a field, or ``record.field``) of a default ``NodeConfig``."""
    return functools.reduce(getattr, path.split("."), NodeConfig(data_dir=Path("unused")))


def code_default(flag: str, param) -> object:
    """The default of a flag as the code has it: its ``NodeConfig`` field's (read from an
    instance, negated for ``--no-…``), else the click parameter's."""
    setting = SETTINGS[flag]
    if setting.field is None or setting.field == "data_dir":
        return param.default
    value = config_value(setting.field)
    return (not value) if setting.inverted else value


def test_defaults_shown_are_the_codes():
    rows = page_rows("Flags")
    assert set(rows) == set(SETTINGS)
    for flag, param in node_params().items():
        setting = SETTINGS[flag]
        value = code_default(flag, param)
        if setting.field is not None and setting.field != "data_dir":
            # the flag's own default leaves the field's in force: one default, not two
            assert param.default in (None, False, value), (flag, param.default, value)
        expected = setting.when_unset if value in (None, [], {}) and setting.when_unset else show_value(value)
        shown = rows[flag][2].strip("`")
        assert shown == expected, f"docs/configuration.md shows {flag} default {shown!r}, the code has {expected!r}"


def product_env_names() -> set[str]:
    names = set()
    for folder in PRODUCT:
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(r"\bEXO_P2P_[A-Z0-9]+(?:_[A-Z0-9]+)*\b", path.read_text()))
    return names


def test_every_env_var_of_the_code_is_in_the_page():
    rows = page_rows("Environment variables")
    names = product_env_names()
    assert {"EXO_P2P_HOME", "EXO_P2P_API", "EXO_P2P_BLAS"} <= names  # the scan finds what it should
    missing = sorted(names - set(rows))
    assert not missing, f"EXO_P2P_ variables the code reads but docs/configuration.md does not list: {missing}"
    assert {s.env for s in SETTINGS.values() if s.env} | {e.name for e in ENVIRONMENT} == set(rows)


@pytest.mark.parametrize("flag", ["--api-port", "--no-mdns", "--name", "--data-dir"])
def test_derived_columns(flag):
    setting = SETTINGS[flag]
    expected = {"--api-port": ("EXO_P2P_API_PORT", "api-port"), "--no-mdns": ("EXO_P2P_NO_MDNS", "no-mdns"),
                "--name": ("EXO_P2P_NAME", "name"), "--data-dir": ("EXO_P2P_HOME", None)}[flag]
    assert (setting.env, setting.key) == expected
