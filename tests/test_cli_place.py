"""The ``exo-p2p`` CLI against the fake node API of ``tests/support/fake_node.py`` served on
127.0.0.1 (docs/cli.md): ``place`` (its wait, progress bar and
errors), ``delete``, ``stop`` and the ``ps``/``ls`` aliases.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from tests.support.fake_node import error_lines, invoke, served
from tests.support.fake_node import fast_polls  # noqa: F401  (autouse)


@pytest.mark.integration
def test_bad_sharding_is_a_usage_error(served):
    result = invoke(["place", "m", "--sharding", "diagonal", "--api", served.url])
    assert result.exit_code == 2
    assert served.paths() == []


@pytest.mark.integration
def test_place_waits_with_progress_until_ready(served):
    result = invoke(["place", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 0, result.output
    polls = [p for p in served.paths("GET") if p.startswith("/instances/inst")]
    assert len(polls) == 3  # 10 layers per poll, 30 layers
    (inst,) = served.node.instances.values()
    assert inst["status"] == "ready"
    assert f"instance {inst['instance_id']} is ready" in result.stdout
    assert "30/30" in result.stderr and "layers" in result.stderr


@pytest.mark.integration
def test_place_no_wait_returns_at_once(served):
    result = invoke(["place", "smollm2-135m-instruct", "--no-wait", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert served.paths("GET") == ["/state", "/instances"]  # only the replica check (State first), no polling
    assert "placed smollm2-135m-instruct as instance inst0001" in result.stdout


@pytest.mark.integration
def test_place_failed_instance_exits_1_with_reason(served):
    served.node.fail_reason = "runner exited with code -9 while loading layer 12"
    result = invoke(["place", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 1
    assert error_lines(result)[-1] == (
        "error: instance inst0001-smollm2-135m-instruct of smollm2-135m-instruct failed: "
        "runner exited with code -9 while loading layer 12"
    )


@pytest.mark.integration
def test_place_timeout_exits_1(served):
    served.node.layers_per_poll = 0
    result = invoke(["place", "smollm2-135m-instruct", "--timeout", "0.2", "--api", served.url])
    assert result.exit_code == 1
    assert "is not ready after 0.2 s (status loading, 0/30 layers)" in error_lines(result)[-1]


@pytest.mark.integration
def test_delete_by_id_and_unique_prefix(served):
    served.node.place({"model": "a"})
    served.node.place({"model": "b"})
    result = invoke(["delete", "inst0001-a", "--api", served.url])
    assert result.exit_code == 0 and "deleted instance inst0001-a" in result.stdout
    result = invoke(["delete", "inst0002", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert served.node.instances == {}
    result = invoke(["delete", "inst0002", "--api", served.url])
    assert result.exit_code == 1 and error_lines(result) == ["error: no instance inst0002 (`exo-p2p instances` lists the ids)"]


@pytest.mark.integration
def test_place_bar_shows_phases_and_keeps_its_clock(served):
    from exo_p2p.cli.placement.waiting import instance_phase

    served.node.warmup_polls = 3
    result = invoke(["place", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 0, result.output
    phases = [line.split(": ", 1)[1] for line in result.stderr.splitlines() if line.startswith("smollm2-135m-instruct: ")]
    assert phases == ["loading layers", "warming up", "ready"]
    shard = lambda status: {"status": status}  # noqa: E731
    assert instance_phase({"status": "loading", "shards": [shard("pending"), shard("loading")]}) == "preparing"
    assert instance_phase({"status": "loading", "shards": [shard("connecting"), shard("loading")]}) == "connecting ranks"
    assert instance_phase({"status": "loading", "shards": [shard("loaded"), shard("loading")]}) == "loading layers"
    assert instance_phase({"status": "loading", "shards": [shard("warming_up"), shard("ready")]}) == "warming up"
    assert instance_phase({"status": "ready", "shards": [shard("ready")]}) == "ready"


def test_bar_clock_runs_when_the_bar_is_full():
    from rich.progress import Progress

    from exo_p2p.cli.placement.waiting import _Clock

    now = [0.0]
    progress = Progress(get_time=lambda: now[0])
    task_id = progress.add_task("m", total=6)
    now[0] = 5.0
    progress.update(task_id, completed=6)  # full: rich's TimeElapsedColumn stops here
    now[0] = 9.0
    task = progress.tasks[0]
    assert str(_Clock().render(task)) == "0:00:09"


@pytest.mark.integration
def test_placing_a_model_twice_does_not_add_a_replica_unless_asked(served):
    assert invoke(["place", "smollm2-135m-instruct", "--no-wait", "--api", served.url]).exit_code == 0
    result = invoke(["place", "smollm2-135m-instruct", "--no-wait", "--api", served.url])
    assert result.exit_code == 0, result.output  # the model is placed: what was asked holds
    assert "already has 1 instance (inst0001)" in result.stderr and "not placing another" in result.stderr
    assert "--replica adds a replica" in result.stderr
    assert len(served.node.instances) == 1
    result = invoke(["place", "smollm2-135m-instruct", "--no-wait", "--replica", "--api", served.url])
    assert result.exit_code == 0 and len(served.node.instances) == 2


@pytest.mark.integration
def test_placing_a_model_twice_in_a_terminal_asks_nothing_and_reads_no_input(served):
    """Pasted into a terminal, the lines after ``place`` are the shell's, not answers to a
    question: ``place`` of a placed model reads nothing, says so and ends with 0."""
    import pty

    served.node.place({"model": "smollm2-135m-instruct"})
    env = {k: v for k, v in os.environ.items() if k != "EXO_P2P_API"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on the pty's terminal
        os.execve(sys.executable, [sys.executable, "-m", "exo_p2p", "place", "smollm2-135m-instruct", "--no-wait",
                                   "--api", served.url], env)  # fmt: skip
    os.write(fd, b"exo-p2p chat hello\n")  # the next pasted line, typed ahead
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        seen += data
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert b"already has 1 instance" in seen and b"not placing another" in seen, seen
    assert b"?" not in seen.replace(b"exo-p2p chat hello", b""), seen  # no question was asked
    assert len(served.node.instances) == 1


@pytest.mark.integration
def test_ps_ls_aliases_and_stop_model(served):
    served.node.place({"model": "smollm2-135m-instruct"})
    served.node.place({"model": "smollm2-135m-instruct"})
    served.node.place({"model": "other"})
    assert invoke(["ps", "--api", served.url]).stdout == invoke(["instances", "--api", served.url]).stdout
    assert invoke(["ls", "--api", served.url]).stdout == invoke(["models", "--api", served.url]).stdout
    result = invoke(["stop", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert list(served.node.instances) == ["inst0003-other"]
    assert result.stdout.count("deleted instance") == 2
    result = invoke(["stop", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 1 and error_lines(result) == ["error: no instance of smollm2-135m-instruct is placed (see `exo-p2p instances`)"]
    # `rm` deletes a model's pulled/fetched files from this node (docs/models.md), as in ollama
    assert invoke(["rm", "x", "--api", served.url]).exit_code == 1


@pytest.mark.integration
def test_delete_with_a_model_name_hints_at_stop(served):
    served.node.place({"model": "smollm2-135m-instruct"})
    result = invoke(["delete", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert "is a model, not an instance id: `exo-p2p stop smollm2-135m-instruct`" in line
    result = invoke(["delete", "nope", "--api", served.url])
    assert error_lines(result) == ["error: no instance nope (`exo-p2p instances` lists the ids)"]
