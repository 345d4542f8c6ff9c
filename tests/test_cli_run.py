"""``exo-p2p run`` (docs/cli.md): the node it starts (the fake node of
``tests/support/fake_node.py`` run as a process, or a real one), the one it finds answering,
and how it stops what it started on exit, Ctrl-C and a node that ignores SIGTERM.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.fake_node import __file__ as FAKE_NODE
from tests.support.fake_node import closed_port, error_lines, invoke, served
from tests.support.fake_node import fast_polls  # noqa: F401  (autouse)


def _fake_node_command(monkeypatch):
    from exo_p2p.cli.chat import local_node

    def command(api_port: int, data_dir: Path, private: bool = True) -> list[str]:
        # a private node's state dir is DATA_DIR/private-runs/run-XXXX (removed after the
        # run): the fake writes what the tests read into DATA_DIR itself
        home = data_dir.parent.parent if data_dir.parent.name == "private-runs" else data_dir
        (home / "private").write_text(str(private))
        (home / "state-dir").write_text(str(data_dir))
        return [sys.executable, FAKE_NODE, "--api-port", str(api_port), "--data-dir", str(home)]

    monkeypatch.setattr(local_node, "node_command", command)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _no_default_node(monkeypatch) -> str:
    """Point the default API URL at a closed port (tests never use the real default)."""
    from exo_p2p.cli.node_api import endpoint

    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setattr(endpoint, "DEFAULT_API", url)
    return url


@pytest.mark.integration
def test_run_starts_a_node_places_answers_and_stops_it(monkeypatch, tmp_path):
    _fake_node_command(monkeypatch)
    _no_default_node(monkeypatch)
    result = invoke(["run", "smollm2-135m-instruct", "What is the capital of France?", "--max-tokens", "5",
                     "--data-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == "The capital of France is Paris.\n"
    assert "starting one for this command" in result.stderr and "30/30" in result.stderr
    pid = int((tmp_path / "fake-node.pid").read_text())
    assert _gone(pid)
    # its state was a fresh dir of its own (exo_p2p.cli.chat.private_state), removed after
    state_dir = Path((tmp_path / "state-dir").read_text())
    assert state_dir.parent == tmp_path / "private-runs" and not state_dir.exists()
    log = (tmp_path / "run-node.log").read_text()
    assert "POST /instances" in log and "POST /v1/chat/completions" in log


@pytest.mark.integration
def test_run_uses_an_answering_node_and_an_existing_instance(served, tmp_path):
    served.node.place({"model": "smollm2-135m-instruct"})
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--api", served.url, "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert served.paths("POST") == ["/v1/chat/completions"]  # waited for the loading one, no new placement
    assert not (tmp_path / "run-node.log").exists()


@pytest.mark.integration
def test_run_reports_a_node_that_does_not_start(monkeypatch, tmp_path):
    from exo_p2p.cli.chat import local_node

    code = "import sys; print('loading things'); print('error: API port 1 on 127.0.0.1 is not available'); sys.exit(3)"
    monkeypatch.setattr(local_node, "node_command", lambda port, data_dir, private=True: [sys.executable, "-c", code])
    _no_default_node(monkeypatch)
    (tmp_path / "run-node.log").write_text("".join(f"stale line {i} of an earlier run\n" for i in range(30)))
    result = invoke(["run", "m", "hi", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    first = error_lines(result)[1]  # after "no node answers …; starting one"
    # the reason first, then only this run's lines
    assert first.startswith("error: could not start a node: API port 1 on 127.0.0.1 is not available (the node exited with code 3)"), first
    assert "loading things" in result.stderr and "stale line" not in result.stderr


@pytest.mark.integration
def test_run_does_not_start_a_node_for_a_remote_api(tmp_path):
    result = invoke(["run", "m", "hi", "--api", "http://192.0.2.1:9", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert error_lines(result)[0].startswith("error: nothing answers at http://192.0.2.1:9")


@pytest.mark.integration
def test_run_with_an_explicit_api_that_answers_nothing_is_an_error(monkeypatch, tmp_path):
    """An explicit --api (or EXO_P2P_API) that answers nothing is an error,
    not a reason to start a node elsewhere."""
    _fake_node_command(monkeypatch)
    url = f"http://127.0.0.1:{closed_port()}"
    for args, env in (([ "--api", url], None), ([], {"EXO_P2P_API": url})):
        result = invoke(["run", "m", "hi", *args, "--data-dir", str(tmp_path)], env=env)
        assert result.exit_code == 1
        (line,) = error_lines(result)
        assert line.startswith(f"error: nothing answers at {url}")
        assert not (tmp_path / "private").exists()  # no node was started


@pytest.mark.integration
def test_run_starts_a_private_node_unless_lan(monkeypatch, tmp_path):
    """The node `run` starts is private (own cluster, no mDNS, loopback)."""
    from exo_p2p.cli.chat.local_node import node_command

    argv = node_command(5000, tmp_path)
    assert "--no-mdns" in argv and argv[argv.index("--listen-host") + 1] == "127.0.0.1"
    cluster = argv[argv.index("--cluster") + 1]
    assert cluster.startswith("run-") and cluster != node_command(5000, tmp_path)[argv.index("--cluster") + 1]
    lan = node_command(5000, tmp_path, private=False)
    assert "--no-mdns" not in lan and "--cluster" not in lan and "--listen-host" not in lan
    # and `run` asks for the private one unless --lan
    _fake_node_command(monkeypatch)
    _no_default_node(monkeypatch)
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "private").read_text() == "True" and "private: loopback only, no mDNS" in result.stderr
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--lan", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "private").read_text() == "False"


@pytest.mark.integration
def test_running_node_is_stopped_when_the_block_is_interrupted(monkeypatch, tmp_path):
    from rich.console import Console

    from exo_p2p.cli.chat.local_node import running_node

    _fake_node_command(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        with running_node(tmp_path, Console(stderr=True), start_timeout=30) as url:
            assert url.startswith("http://127.0.0.1:")
            raise KeyboardInterrupt
    assert _gone(int((tmp_path / "fake-node.pid").read_text()))


@pytest.mark.integration
def test_stop_process_kills_a_node_that_ignores_sigterm():
    from exo_p2p.cli.chat.local_node import stop_process

    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        started = time.monotonic()
        stop_process(proc, timeout=0.5)
        assert proc.returncode == -9
        assert time.monotonic() - started < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.integration
def test_ctrl_c_while_waiting_exits_130_quietly(tmp_path):
    import signal

    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    node = subprocess.Popen(
        [sys.executable, FAKE_NODE, "--api-port", str(port), "--data-dir", str(tmp_path), "--stall"],
        stdout=subprocess.DEVNULL,
    )
    cli = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "fake node did not come up"
                time.sleep(0.1)
        env = {k: v for k, v in os.environ.items() if k != "EXO_P2P_API"}
        # A terminal starts a command with SIGINT at its default; a suite started in the
        # background (`cmd &` in a script, nohup, some CI runners) passes SIGINT down ignored,
        # and Python then (rightly, as POSIX programs do) never turns it into
        # KeyboardInterrupt: give the CLI the terminal's disposition.
        cli = subprocess.Popen(
            [sys.executable, "-m", "exo_p2p", "place", "m", "--api", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        placed = cli.stdout.readline()
        assert placed.startswith("placed m as instance")
        time.sleep(0.5)
        cli.send_signal(signal.SIGINT)
        out, err = cli.communicate(timeout=30)
        assert cli.returncode == 130
        assert "Traceback" not in err and "error" not in err
        # it says the instance stays placed and how to delete it
        instance_id = placed.split("as instance ", 1)[1].split()[0]
        assert f"instance {instance_id} stays placed and keeps loading" in err, err
        assert f"exo-p2p delete {instance_id}" in err
    finally:
        for proc in (cli, node):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.e2e
@pytest.mark.skipif(importlib.util.find_spec("exo_p2p.node") is None, reason="exo_p2p.node not built yet")
def test_run_with_a_real_node_answers_and_leaves_nothing(tmp_path):
    import psutil

    env = {k: v for k, v in os.environ.items() if k != "EXO_P2P_API"}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from exo_p2p.cli import main; from exo_p2p.cli.node_api import endpoint; "
         f"endpoint.DEFAULT_API = 'http://127.0.0.1:{closed_port()}'; sys.argv[0] = 'exo-p2p'; main.main()",
         "run", "smollm2-135m-instruct", "What is the capital of France?",
         "--temperature", "0", "--max-tokens", "24", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + (tmp_path / "run-node.log").read_text()
    assert "Paris" in proc.stdout
    left = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert left == []


@pytest.mark.integration
def test_stderr_is_not_wrapped_when_it_is_not_a_terminal(monkeypatch, tmp_path):
    _fake_node_command(monkeypatch)
    _no_default_node(monkeypatch)
    long_dir = tmp_path / ("a-long-directory-name-" * 4)
    long_dir.mkdir()
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--data-dir", str(long_dir)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stderr.splitlines() if "starting one for this command" in line]
    assert line.endswith(f"data dir {long_dir})")
