"""The ``exo-p2p node`` command (docs/cli.md): its flags, environment variables and config file
building one ``NodeConfig``, its exits, ``cluster-secret``, every command's ``--help``, and the
JSON log lines of a node and its runners.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_node import error_lines, invoke
from tests.support.fake_node import fast_polls  # noqa: F401  (autouse)


def test_bad_memory_limit_exits_2_with_one_line(monkeypatch):
    from exo_p2p.cli.cluster import commands as cluster_cmds

    started = []
    monkeypatch.setattr(cluster_cmds, "run_node", started.append)
    result = invoke(["node", "--memory-limit", "12 potatoes"])
    assert result.exit_code == 2
    (line,) = error_lines(result)
    assert line.startswith("error: --memory-limit: invalid size '12 potatoes'")
    assert started == []


def test_node_flags_build_the_config(monkeypatch, tmp_path):
    from exo_p2p.cli.cluster import commands as cluster_cmds

    started = []
    monkeypatch.setattr(cluster_cmds, "run_node", started.append)
    secret = tmp_path / "secret"
    secret.write_text("00" * 32)
    args = [
        "node", "--api-port", "6000", "--api-host", "0.0.0.0", "--listen-port", "0",
        "--listen-host", "127.0.0.1", "--data-dir", str(tmp_path / "d"), "--memory-limit", "512MiB",
        "--models-dir", str(tmp_path / "m1"), "--models-dir", str(tmp_path / "m2"),
        "--log-format", "json", "--log-level", "DEBUG", "--cluster", "lab",
        "--cluster-secret", str(secret), "--bootstrap", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWGsG9UpqnLmq5B4zrznCrWuMJehSwkNutRzKTM4hkPbfM",
        "--bootstrap", "/ip4/127.0.0.1/tcp/2/p2p/12D3KooWK1tzYBDEUQtJqjQw6LkzigCF17xp3jneLr4QbNEJbt8s", "--priority", "3", "--new-identity",
        "--name", "gamma", "--queue-limit", "8", "--prefill-chunk-size", "64", "--no-mdns",
    ]  # fmt: skip
    result = invoke(args)
    assert result.exit_code == 0, result.output
    (config,) = started
    assert config.api_port == 6000 and config.api_host == "0.0.0.0"
    assert config.listen_port == 0 and config.listen_host == "127.0.0.1"
    assert config.data_dir == tmp_path / "d"
    assert config.memory_limit == 512 * 1024**2
    assert config.models_dirs == [tmp_path / "m1", tmp_path / "m2"]
    assert (config.log_format, config.log_level, config.cluster) == ("json", "debug", "lab")
    assert config.cluster_secret_file == secret
    assert config.bootstrap == ["/ip4/127.0.0.1/tcp/1/p2p/12D3KooWGsG9UpqnLmq5B4zrznCrWuMJehSwkNutRzKTM4hkPbfM", "/ip4/127.0.0.1/tcp/2/p2p/12D3KooWK1tzYBDEUQtJqjQw6LkzigCF17xp3jneLr4QbNEJbt8s"]
    assert (config.priority, config.new_identity, config.friendly_name) == (3, True, "gamma")
    assert (config.queue_limit, config.engine.prefill_chunk_size, config.mdns) == (8, 64, False)


def test_node_defaults_come_from_config(monkeypatch, tmp_path):
    from exo_p2p import config as cfg
    from exo_p2p.cli.cluster import commands as cluster_cmds

    started = []
    monkeypatch.setattr(cluster_cmds, "run_node", started.append)
    result = invoke(["node"], env={"EXO_P2P_HOME": str(tmp_path / "home")})
    assert result.exit_code == 0, result.output
    (config,) = started
    assert config.data_dir == tmp_path / "home"
    assert (config.api_host, config.api_port) == (cfg.DEFAULT_API_HOST, cfg.DEFAULT_API_PORT)
    assert config.listen_port == cfg.DEFAULT_LISTEN_PORT
    assert config.memory_limit is None and config.mdns is True and config.bootstrap == []
    from exo_p2p.defaults import NODE_PROMPT_CACHE_BYTES
    from exo_p2p.types.engine import EngineSettings

    # every engine default from exo_p2p.defaults; a node keeps a prompt cache
    assert config.engine == EngineSettings(prompt_cache_bytes=NODE_PROMPT_CACHE_BYTES) == cfg.NodeConfig(data_dir=tmp_path).engine


def test_node_engine_flags_make_one_record(tmp_path):
    from exo_p2p.cli.errors import CliError
    from exo_p2p.cli.cluster.node_config import build_node_config
    from exo_p2p.defaults import PREFILL_CHUNK_SIZE
    from exo_p2p.types.engine import EngineSettings

    config = build_node_config(data_dir=tmp_path, max_batch=4, prompt_cache_bytes=1000, kv_cache_bytes=5000)
    assert config.engine == EngineSettings(PREFILL_CHUNK_SIZE, 4, 1000, 5000)  # only given ones override
    with pytest.raises(CliError) as bad:
        build_node_config(data_dir=tmp_path, max_batch=0)
    assert bad.value.exit_code == 2 and "--max-batch" in str(bad.value)


def test_node_setting_flags_are_checked_in_order_and_kept_normalized():
    """``settings.apply.field_values``: only the flags given become fields (the log level
    lower-cased); the first bad one, in table order, is the usage error."""
    from exo_p2p.settings.apply import SettingError, field_values

    assert field_values({}) == {}
    assert field_values({"memory_limit": "1GiB", "cpu_weights": "stored", "routing": "load", "log_format": "json",
                         "log_level": "DEBUG"}) == {
        "memory_limit": 1 << 30, "cpu_weights": "stored", "routing": "load", "log_format": "json", "log_level": "debug"}
    with pytest.raises(SettingError) as bad:
        field_values({"memory_limit": "64", "routing": "nearest", "log_level": "loud"})
    assert "less than 64 MiB" in str(bad.value)
    with pytest.raises(SettingError, match="--routing"):
        field_values({"request_log_bytes": -1, "routing": "nearest"})  # in table order, not the order given


def test_node_exit_code_is_passed_on(monkeypatch, tmp_path):
    from exo_p2p.cli.cluster import commands as cluster_cmds

    monkeypatch.setattr(cluster_cmds, "run_node", lambda config: 1)
    assert invoke(["node", "--data-dir", str(tmp_path)]).exit_code == 1


def test_node_without_a_node_runtime_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "exo_p2p.node", None)  # makes the import fail
    result = invoke(["node", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert line.startswith("error: this installation cannot run a node:")


def test_missing_cluster_secret_file_exits_2(monkeypatch, tmp_path):
    from exo_p2p.cli.cluster import commands as cluster_cmds

    monkeypatch.setattr(cluster_cmds, "run_node", lambda config: pytest.fail("must not start"))
    result = invoke(["node", "--cluster-secret", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert len(error_lines(result)) == 1


def test_cluster_secret_writes_a_0600_file(tmp_path):
    path = tmp_path / "cluster.key"
    old = os.umask(0)
    try:
        result = invoke(["cluster-secret", str(path)])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text().strip()
    assert len(secret) == 64 and int(secret, 16) >= 0
    again = invoke(["cluster-secret", str(path)])
    assert again.exit_code == 1 and "exists" in error_lines(again)[0]
    assert path.read_text().strip() == secret
    assert invoke(["cluster-secret", str(path), "--force"]).exit_code == 0
    assert path.read_text().strip() != secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_cluster_secret_printed_when_no_file():
    first, second = invoke(["cluster-secret"]), invoke(["cluster-secret"])
    assert first.exit_code == 0
    assert len(first.stdout.strip()) == 64 and first.stdout != second.stdout


def test_help_shows_no_python_types_and_lists_the_env_vars():
    from exo_p2p.cli.main import app

    commands = ["node", "place", "run", "chat", "models", "instances", "previews", "delete", "stop", "doctor", "nodes", "cluster-secret"]
    for command in commands + []:
        result = invoke([command, "--help"])
        assert result.exit_code == 0
        for bad in ("<bool>", "<int", "<str>", "<float", "list[", "<path>"):
            assert bad not in result.stdout, (command, bad)
    node_help = invoke(["node", "--help-all"], env={"COLUMNS": "400"}).stdout
    import typer.main

    params = [p for p in typer.main.get_command(app).commands["node"].params if not p.hidden and p.name not in ("help", "help_all")]
    assert "environment variable (EXO_P2P_ and the flag's name: --api-port is EXO_P2P_API_PORT)" in node_help
    for param in params:
        assert param.envvar and (param.envvar.startswith("EXO_P2P_")), param.name
        derived = "EXO_P2P_" + param.opts[0][2:].upper().replace("-", "_")
        assert param.opts[0] in node_help and (param.envvar == derived or param.envvar in node_help), param.envvar
    assert "--install-completion" in invoke(["--help"]).stdout


def test_node_flags_from_env_and_config_file(monkeypatch, tmp_path):
    from exo_p2p.cli.cluster import commands as cluster_cmds

    started = []
    monkeypatch.setattr(cluster_cmds, "run_node", started.append)
    data = tmp_path / "d"
    data.mkdir()
    (data / "config.toml").write_text('api-port = 6001\nname = "from-file"\nbootstrap = []\nno-mdns = true\nmodels_dir = ["/m"]\n')
    env = {"EXO_P2P_HOME": str(data), "EXO_P2P_NAME": "from-env", "EXO_P2P_QUEUE_LIMIT": "9", "EXO_P2P_LOG_FILE": str(tmp_path / "n.log")}
    assert invoke(["node"], env=env).exit_code == 0
    assert invoke(["node", "--name", "from-flag"], env=env).exit_code == 0
    file_only, flag = started
    assert (file_only.api_port, file_only.friendly_name, file_only.queue_limit, file_only.mdns) == (6001, "from-env", 9, False)
    assert file_only.models_dirs == [Path("/m")] and file_only.data_dir == data and file_only.log_file == tmp_path / "n.log"
    assert flag.friendly_name == "from-flag"  # the command line, then the environment, then the file
    started.clear()
    assert invoke(["node"], env={**env, "EXO_P2P_MODELS_DIR": "/a:/b", "EXO_P2P_NO_MDNS": "0", "EXO_P2P_PRIORITY": "4"}).exit_code == 0
    (from_env,) = started
    assert from_env.models_dirs == [Path("/a"), Path("/b")] and from_env.priority == 4 and from_env.mdns is True
    started[:] = [file_only, flag]
    (data / "config.toml").write_text("api_prot = 1\n")
    result = invoke(["node"], env=env)
    assert result.exit_code == 2 and "unknown setting 'api_prot'" in error_lines(result)[0]
    (data / "config.toml").write_text('api-port = "many"\n')
    result = invoke(["node"], env=env)
    assert result.exit_code == 2 and "config.toml: api-port:" in error_lines(result)[0]
    assert len(started) == 2


@pytest.mark.integration
def test_runner_output_becomes_json_lines(tmp_path):
    """With --log-format json a runner's prints, warnings and traceback are
    JSON lines too (the node sets the runner's log settings in its environment)."""
    code = (
        "from exo_p2p.logs.configure import configure_runner_output; configure_runner_output(); "
        "print('hello from a runner'); import os, sys; print('to stderr', file=sys.stderr); "
        "raise ValueError('boom')"
    )
    env = {**os.environ, "EXO_P2P_RUNNER_LOG": json.dumps({"format": "json", "node": "alpha"})}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    records = [json.loads(line) for line in proc.stderr.splitlines()]
    assert {r["node"] for r in records} == {"alpha"}
    lines = [r["line"] for r in records]
    assert "hello from a runner" in lines and "to stderr" in lines and any("ValueError: boom" in x for x in lines)


@pytest.mark.integration
def test_node_log_lines_carry_the_node_name_and_json_parses(tmp_path):
    """JSON logs in a real node process that cannot start (its port is taken): every
    line of its JSON log file parses and names the node; the terminal gets the one-line
    error only."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log_file = tmp_path / "node.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EXO_P2P_")}
        proc = subprocess.run(
            [sys.executable, "-m", "exo_p2p", "node", "--name", "alpha", "--api-port", str(port), "--listen-port", "0",
             "--data-dir", str(tmp_path / "d"), "--log-format", "json", "--log-file", str(log_file), "--no-mdns"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: API port") and len(proc.stderr.strip().splitlines()) == 1
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert records and all(r["node"] == "alpha" for r in records)
    assert any(r["level"] == "error" and "API port" in r["event"] for r in records)
    # the console format names the node too
    console_log = tmp_path / "console.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = subprocess.run(
            [sys.executable, "-m", "exo_p2p", "node", "--name", "alpha", "--api-port", str(taken.getsockname()[1]),
             "--listen-port", "0", "--data-dir", str(tmp_path / "d"), "--log-file", str(console_log), "--no-mdns"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.startswith("error: API port")
    lines = console_log.read_text().splitlines()
    assert lines and all("node=alpha" in line for line in lines), lines
