"""A node's speed calibration (``worker.calibrate``, docs/placement-speed.md): the answer parsed,
bounded and quantised, the re-measure rule, failures dropped and logged, the idle rule, the
CLI's column, and (in a subprocess: the real MLX measure) figures that parse and a 30 %
CPU quota that shows in them."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest
import trio

from exo_p2p.cli.output.render import speed_lines, speed_text
from exo_p2p.node.worker_env import node_idle
from exo_p2p.types import ChatMessage, GenerationParams, NodeSpeed, State, TaskRecord, TextGeneration
from tests.support.rules.strategies import _instance
from worker.calibrate.run import Calibration, parse_speed, speed_moved

GOOD = NodeSpeed(decode_ns_per_kib=870, prefill_ns_per_kib=71, mem_mib_per_s=11_000)


def test_parse_quantises_and_refuses_nonsense() -> None:
    assert parse_speed('{"decode_ns_per_kib": 873, "prefill_ns_per_kib": 71, "mem_mib_per_s": 11234}\n') == GOOD
    for bad in ("", "nope", "[]", '{"decode_ns_per_kib": 1}', '{"decode_ns_per_kib": "9", "prefill_ns_per_kib": 1, "mem_mib_per_s": 1}',
                '{"decode_ns_per_kib": 0, "prefill_ns_per_kib": 1, "mem_mib_per_s": 1}',
                '{"decode_ns_per_kib": 1, "prefill_ns_per_kib": 1e12, "mem_mib_per_s": 1}',
                '{"decode_ns_per_kib": 1, "prefill_ns_per_kib": 99999999999, "mem_mib_per_s": 1}'):
        with pytest.raises(ValueError):
            parse_speed(bad)


def test_a_steady_speed_is_not_news() -> None:
    assert speed_moved(None, GOOD)
    assert not speed_moved(GOOD, NodeSpeed(1000, 80, 9000))  # within 30 %
    assert speed_moved(GOOD, NodeSpeed(2900, 71, 11_000))  # a node held to 30 % of a core


def test_a_failed_calibration_keeps_the_last_speed() -> None:
    answers = [GOOD, ValueError("calibration exited 1"), NodeSpeed(1000, 80, 9000), NodeSpeed(3000, 300, 3000)]

    def measure() -> NodeSpeed:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cal = Calibration(measure=measure)

    async def main() -> list[NodeSpeed | None]:
        seen = []
        for _ in range(4):
            await cal.measure()
            seen.append(cal.speed)
        return seen

    assert trio.run(main) == [GOOD, GOOD, GOOD, NodeSpeed(3000, 300, 3000)]


def test_idle_means_no_unfinished_task_on_this_nodes_instances() -> None:
    task = TextGeneration("t1", "i1", "m", GenerationParams((ChatMessage("user", "hi"),)), "node-b")  # type: ignore[arg-type]
    state = State(instances={"i1": _instance("i1", "node-a")})  # type: ignore[arg-type]
    assert node_idle(state, "node-a") and node_idle(State(), "node-a")
    running = msgspec.structs.replace(state, tasks={"t1": TaskRecord(task, "running")})  # type: ignore[arg-type]
    assert not node_idle(running, "node-a") and node_idle(running, "node-c")
    done = msgspec.structs.replace(state, tasks={"t1": TaskRecord(task, "complete")})  # type: ignore[arg-type]
    assert node_idle(done, "node-a")


def test_cli_speed_column() -> None:
    assert speed_text({"decode_ns_per_kib": 1000, "prefill_ns_per_kib": 1, "mem_mib_per_s": 900}) == "1024 µs/MiB · 900 MiB/s"
    assert speed_text(None) == "-" and speed_text({"decode_ns_per_kib": "x"}) == "-"
    nodes = [{"node_id": "n1", "friendly_name": "big", "speed": {"decode_ns_per_kib": 500, "mem_mib_per_s": 9}},
             {"node_id": "n2", "friendly_name": "", "speed": None}]
    assert speed_lines(nodes) == ["  big  decode 512 µs/MiB · 9 MiB/s"]


@pytest.mark.integration
def test_the_real_measure_answers_figures_that_parse() -> None:
    out = subprocess.run([sys.executable, "-m", "worker.calibrate.measure"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    speed = parse_speed(out.stdout)
    assert speed.prefill_ns_per_kib < speed.decode_ns_per_kib * 2, json.loads(out.stdout)
