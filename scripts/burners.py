"""CPU burners for scripts/busy_recipe.py: ``count`` busy-looping processes in ONE process
group, in a session of their own (the default) or in the caller's session.

Why one session: on Linux with ``sched_autogroup_enabled`` (the default on desktop kernels)
the scheduler shares CPU time between sessions first and ranks nice only within a session. A
user's other work is a session of its own (a build started in another terminal, a service),
so 30 burners there take the other half of the machine while the node's session keeps its
share. 30 burners each in a session of its own would be 30 users' work: the node's session
then gets 1/31 of the machine (measured: 10 s loop lags, docs/testing.md). ``same_session``
puts the burners in the caller's session instead (beside the nodes, at the same nice).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

_BURN = """
import os, sys
for _ in range(int(sys.argv[1]) - 1):
    if os.fork() == 0:
        break
while True:
    pass
"""


def start_burners(count: int, *, same_session: bool = False) -> subprocess.Popen[bytes]:
    """Start ``count`` (≥ 1) burners; the returned process leads their process group."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    return subprocess.Popen([sys.executable, "-c", _BURN, str(count)], stdin=subprocess.DEVNULL,
                            start_new_session=not same_session, process_group=0 if same_session else None)


def stop_burners(group: subprocess.Popen[bytes] | None) -> None:
    """Kill every burner of ``group`` (its process group, which only they are in)."""
    if group is None:
        return
    try:
        os.killpg(group.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    group.wait(timeout=10)
