"""How the master admits a generation across a failover (master.commands ``_submit``; found
by scripts/chaos.py).

The run showed an API retry of ``SubmitTask`` across a master kill: the former master
had created the task on instance A (on a live node, whose runner started it); the new master
decided the retry again and created the same task id on instance B, on the dead master's own
node (not timed out yet). The task's record moved to B, so the runner on A's node had its
status reports refused ("task of an instance this node does not serve": holes in the log that
scripts/chaos.py counts as lost events), and the request waited for B's failure to move.
"""

from __future__ import annotations

from exo_p2p.types import ChatMessage, GenerationParams, SubmitTask, TaskCreated
from master.commands import handle_command
from tests.support.rules.strategies import CARD
from tests.support.rules.master_run import run
from tests.support.rules.submit_instances import two_ready_instances


def submit(task_id: str = "t1", command_id: str = "c1") -> SubmitTask:
    return SubmitTask.generation(command_id, task_id, CARD.model_id, GenerationParams((ChatMessage("user", "hi"),), max_tokens=5), "node-a")  # type: ignore[arg-type]


def test_a_retried_submission_keeps_its_task_where_it_was_created():
    s, ids = two_ready_instances()
    first = handle_command(s, submit())
    (created,) = first.events
    assert isinstance(created, TaskCreated)
    s = run(s, first.events)
    # the retry reaches a master that sees every other instance idler than the task's own
    again = handle_command(s, submit(command_id="c2"), unreachable=frozenset())
    assert again.events == () and again.result.error is None
    assert again.result.instance_id == created.task.instance_id == s.tasks["t1"].task.instance_id


def test_a_new_request_avoids_an_instance_on_a_node_the_master_does_not_hear():
    s, ids = two_ready_instances()
    for dead, alive in (("node-a", "node-b"), ("node-b", "node-a")):
        d = handle_command(s, submit(), unreachable=frozenset({dead}))
        assert d.result.instance_id == ids[alive], (dead, d.result)
    # every ready instance unheard: one of them all the same (it may only be slow)
    d = handle_command(s, submit(), unreachable=frozenset({"node-a", "node-b"}))
    assert d.result.error is None and d.result.instance_id in ids.values()
