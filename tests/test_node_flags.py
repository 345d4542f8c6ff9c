"""The flags of ``exo-p2p node`` as generated from the one table of node settings
(``exo_p2p.settings.table``): each option is its ``Setting`` (type, bounds, repeatable, panel),
a value is applied into ``NodeConfig`` with no code of its own (a setting added in a test
works on the command line, in the environment and in ``config.toml``), and every bad value is
a one-line usage error naming the flag (exit 2). Pure: no process, no socket."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from exo_p2p.cli.errors import CliError
from exo_p2p.cli.main import app  # at collection: its libraries' imports run ldconfig (a process)
from exo_p2p.cli.cluster.node_config import build_node_config
from exo_p2p.cli.cluster.node_flags import HELP_PANELS, NodeCommand, node_config, node_flag_values, node_flags
from exo_p2p.settings.apply import SettingError, checked, field_values
from exo_p2p.settings.setting import Setting
from exo_p2p.settings.table import PANELS, SERVING, SETTINGS

PEER = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWGsG9UpqnLmq5B4zrznCrWuMJehSwkNutRzKTM4hkPbfM"


def run(args: list[str], env: dict | None = None, command: typer.Typer = app):
    return CliRunner().invoke(command, args, env={"EXO_P2P_API": None, "COLUMNS": "200", **(env or {})})


@pytest.fixture
def started(monkeypatch) -> list:
    """The configs ``exo-p2p node`` would have started a node with (the node never starts)."""
    from exo_p2p.cli.cluster import commands as cluster_cmds

    configs: list = []
    monkeypatch.setattr(cluster_cmds, "run_node", configs.append)
    return configs


def test_each_option_is_its_setting_in_table_order():
    command = typer.main.get_command(app).commands["node"]  # type: ignore[attr-defined]
    params = [p for p in command.params if p.name not in ("help", "help_all")]
    assert [p.opts for p in params] == [[s.flag] for s in SETTINGS.values()]
    for param, s in zip(params, SETTINGS.values()):
        assert param.name == s.param and param.multiple == s.repeatable and bool(param.is_flag) == s.switch, s.flag
        assert (param.min, param.max) == ((s.min, s.max) if s.bounds_in_help else (None, None)), s.flag
        assert param.default == (False if s.switch else None), s.flag  # the field's default stays in force
        assert param.rich_help_panel == s.panel and (s.panel in PANELS or (s.panel is None and s.hidden)), s.flag
    assert {f for flags in HELP_PANELS.values() for f in flags} == {s.flag for s in SETTINGS.values() if not s.hidden}


def test_a_setting_added_to_the_table_needs_no_code_of_its_own(tmp_path):
    """One ``Setting`` (here for an existing field): an option with its env var, its
    ``config.toml`` key, its bounds and help panel, its value in the field."""
    extra = Setting("--moves-budget", "count (≥ 0)", "Test-only twin of --max-moves", "max_moves", "N", type=int,
                    min=0, panel=SERVING)
    saved = dict(SETTINGS)  # put back in place below, in its order (--help's)
    try:
        del SETTINGS["--max-moves"]
        SETTINGS[extra.flag] = extra
        a_new_setting_on_a_command(tmp_path)
    finally:
        SETTINGS.clear()
        SETTINGS.update(saved)
    assert list(SETTINGS) == list(saved)


def a_new_setting_on_a_command(tmp_path: Path) -> None:
    """A command made as ``exo-p2p node`` is, from the table as it is now: the new flag works
    on the command line, in the environment, in ``config.toml``, with its bound and panel."""
    command = typer.Typer()
    configs = []

    @command.command(cls=NodeCommand)
    @node_flags
    def node(ctx: typer.Context, **flags) -> None:
        configs.append(node_config(node_flag_values(ctx)))

    data = tmp_path / "d"
    data.mkdir()
    assert run(["--data-dir", str(data), "--moves-budget", "5"], command=command).exit_code == 0
    assert run(["--data-dir", str(data)], {"EXO_P2P_MOVES_BUDGET": "6"}, command=command).exit_code == 0
    (data / "config.toml").write_text("moves-budget = 7\n")
    assert run(["--data-dir", str(data)], command=command).exit_code == 0
    assert [c.max_moves for c in configs] == [5, 6, 7]
    assert run(["--data-dir", str(data), "--moves-budget", "-1"], command=command).exit_code == 2
    full = run(["--help-all"], command=command).stdout
    assert "--moves-budget" in full and "Test-only twin of --max-moves (default: 2)." in full
    assert "--moves-budget" not in run(["--help"], command=command).stdout  # its panel is --help-all's


@pytest.mark.parametrize(("args", "message"), [
    (["--memory-limit", "12 potatoes"], "--memory-limit: invalid size '12 potatoes'"),
    (["--memory-limit", "64"], "--memory-limit: 64 is 64 bytes, less than 64 MiB"),
    (["--log-format", "xml"], "--log-format must be one of console, json, got 'xml'"),
    (["--log-level", "loud"], "--log-level must be one of debug, info, warning, error"),
    (["--cpu-weights", "fp32"], "--cpu-weights must be one of auto, float32, stored, got 'fp32'"),
    (["--routing", "nearest"], "--routing must be one of prefix, load, got 'nearest'"),
    (["--priority", str(2**31)], "--priority must be between -2147483648 and 2147483647, got 2147483648"),
    (["--api-port", "70000"], "--api-port must be between 0 and 65535, got 70000"),
    (["--listen-port", "-1"], "--listen-port must be between 0 and 65535, got -1"),
    (["--cluster", "x" * 65], "--cluster: cluster name must be 1..64 printable characters"),
    (["--cluster-secret", "/nonexistent/secret"], "--cluster-secret: no such file /nonexistent/secret"),
    (["--bootstrap", PEER, "--bootstrap", "10.0.0.2:52514"], "--bootstrap: '10.0.0.2:52514' is not a peer address"),
    (["--api-key", "  "], "--api-key must not be empty"),
    (["--api-key-file", "/nonexistent/keys"], "--api-key-file: /nonexistent/keys: No such file"),
    (["--cors-origins", "nota-url"], "--cors-origins: CORS origin 'nota-url'"),
    (["--allowed-hosts", "http://box:1"], "--allowed-hosts: allowed host 'http://box:1'"),
    (["--fault-hook", "stall"], "--fault-hook takes KEY=VALUE, got 'stall'"),
    (["--join", "exo1_garbage"], "--join"),
])
def test_a_bad_value_is_one_line_naming_the_flag(started, tmp_path, args, message):
    result = run(["node", "--data-dir", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {message}"), line
    assert started == []


@pytest.mark.parametrize("args", [["--max-batch", "0"], ["--queue-limit", "0"], ["--request-log-bytes", "-1"],
                                  ["--api-port", "many"], ["--no-mdns=maybe"]])
def test_the_command_line_refuses_a_value_of_the_wrong_type_or_out_of_shown_bounds(started, tmp_path, args):
    result = run(["node", "--data-dir", str(tmp_path), *args])
    assert result.exit_code == 2 and args[0].split("=")[0] in result.output and started == []


def test_the_python_keywords_are_the_fields_and_checked_alike(tmp_path):
    config = build_node_config(data_dir=tmp_path, mdns=False, max_batch=3, models_dirs=[Path("~/m")], log_level="INFO",
                               fault_hooks=["fail=loading"])
    assert (config.mdns, config.engine.max_batch, config.log_level) == (False, 3, "info")
    assert config.fault_hooks == {"fail": "loading"}
    assert config.models_dirs == [Path("~/m").expanduser()]
    for bad, message in [({"max_batch": 0}, "--max-batch must be ≥ 1, got 0"),
                         ({"priority": -(2**31) - 1}, "--priority must be between"),
                         ({"routing": "random"}, "--routing must be one of")]:
        with pytest.raises(CliError, match=message) as info:
            build_node_config(data_dir=tmp_path, **bad)
        assert info.value.exit_code == 2
    with pytest.raises(TypeError, match="max_batches"):
        build_node_config(max_batches=3)


def test_two_settings_fill_one_list_field(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# one a line\nb\na\n")
    assert field_values({"api_keys": ["a", " c "], "api_key_file": keys})["api_keys"] == ["a", "c", "b"]


def test_checked_applies_type_check_bounds_and_choices_in_that_order():
    level = SETTINGS["--log-level"]
    assert checked(level, "WARNING") == "warning"
    with pytest.raises(SettingError, match="must be one of"):
        checked(level, "verbose")
    assert checked(SETTINGS["--log-file"], "~/n.log") == Path("~/n.log").expanduser()
    assert checked(SETTINGS["--bootstrap"], (PEER,)) == [PEER]  # a repeatable value is a list
    with pytest.raises(SettingError, match=r"--compact-every must be ≥ 1, got 0"):
        checked(SETTINGS["--compact-every"], 0)


def test_config_file_values_go_through_the_same_checks(started, tmp_path):
    (tmp_path / "config.toml").write_text('routing = "random"\n')
    result = run(["node", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "--routing must be one of prefix, load" in result.stderr
    (tmp_path / "config.toml").write_text("max-batch = 0\n")
    result = run(["node", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "config.toml: max-batch:" in result.stderr
    (tmp_path / "config.toml").write_text('fault-hook = ["fail=loading"]\n')  # hidden: not a key
    result = run(["node", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "unknown setting 'fault-hook'" in result.stderr
    assert started == []
