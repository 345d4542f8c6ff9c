"""When a node may preload its tokenizers: once the instances placed on it have started.

Loading a tokenizer (``exo_p2p.models.token_count``) imports mlx-lm and transformers and
builds the vocabulary in C calls that hold the GIL; run in a thread, it still stalls the
node's trio loop while the thread holds the GIL. Measured with ``exo_p2p.node.loop_watch``
(``scripts/measure_loop_lag.py``, 2 nodes, load average ~10 on 2 cores): the loop's wakes
later than 0.5 s during a placement coincided with that thread in tokenizer ``__init__`` /
``get_vocab``. During a placement that is the worst moment: the node's runners start and load
(CPU), heartbeats must still leave every 0.5 s, and a late one can make the master time the
node out. So the node shows its preloader a State without the instances that are still
starting on it (``settled``): a tokenizer is preloaded once no runner of its instance on this
node is starting (ready, running, failed or gone), and a count request before then loads it on
demand as before.
"""

from __future__ import annotations

import msgspec

from exo_p2p.types import State
from exo_p2p.types.runner import (
    RunnerConnected, RunnerConnecting, RunnerDownloading, RunnerIdle, RunnerLoaded, RunnerLoading, RunnerWarmingUp,
)

STARTING = (RunnerDownloading, RunnerIdle, RunnerConnecting, RunnerConnected, RunnerLoading, RunnerLoaded, RunnerWarmingUp)
"""Runner statuses (``exo_p2p.types.runner``) of a runner that has not finished starting."""


def starting_here(state: State, node_id: str) -> set[str]:
    """Instances whose runner on ``node_id`` has not finished starting (no record yet, or a
    ``STARTING`` status) (pure)."""
    out = set()
    for instance_id, instance in state.instances.items():
        shard = instance.shard_for(node_id)
        record = state.runners.get(shard.runner_id) if shard is not None else None
        if shard is not None and (record is None or isinstance(record.status, STARTING)):
            out.add(instance_id)
    return out


def settled(state: State, node_id: str) -> State:
    """``state`` without the instances ``starting_here`` (pure; the same object when none is)."""
    starting = starting_here(state, node_id)
    if not starting:
        return state
    return msgspec.structs.replace(state, instances={i: inst for i, inst in state.instances.items() if i not in starting})
