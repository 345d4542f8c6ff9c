"""The state of the private node ``exo-p2p run`` starts: fresh every run, models shared.

A data dir holds a node's identity, its replicated event log (the State of the cluster it
was in: its nodes, its instances) and its models. The private node of ``run`` is a cluster
of its own, so it must not start from the log of another cluster that used the same data
dir — a node of the two-node tour would bring that cluster's peers and instances into it,
and ``run`` would fail on an instance of a node that is gone. So the private node gets a
state dir of its own, ``DATA_DIR/private-runs/run-XXXX``: a new identity, an empty log, its
own ``node.lock``; its ``models`` (imported GGUFs, pulled models) and ``config.toml`` are
links to the data dir's, so nothing is imported twice and the user's settings hold. The
state dir is removed when the run ends; one left by a run that was killed is removed by
the next run, once no node holds its lock.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RUNS_DIR = "private-runs"
"""Folder of the data dir holding the private nodes' state dirs."""
SHARED = ("models", "config.toml")
"""What a private node shares with the data dir (links)."""
STALE_AFTER = 60.0
"""Seconds a state dir no node holds must be old before another run removes it (a run that
just made its own has not started its node yet)."""


def unused(state_dir: Path) -> bool:
    """Whether no node holds ``state_dir``'s ``node.lock`` (``exo_p2p.node.process``'s lock): a
    state dir with no lock file, or one whose lock can be taken now."""
    lock_path = state_dir / "node.lock"
    try:
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def remove_stale(data_dir: Path) -> list[Path]:
    """Remove the private state dirs under ``data_dir`` no node uses (runs that were killed);
    returns them."""
    removed = []
    runs = data_dir / RUNS_DIR
    for state_dir in sorted(runs.glob("run-*")) if runs.is_dir() else []:
        if state_dir.is_dir() and time.time() - state_dir.stat().st_mtime > STALE_AFTER and unused(state_dir):
            shutil.rmtree(state_dir, ignore_errors=True)
            removed.append(state_dir)
    return removed


@contextmanager
def private_state(data_dir: Path) -> Iterator[Path]:
    """A fresh state dir for a private node, sharing ``data_dir``'s models and config
    (module docstring); removed on leaving. Raises ``OSError`` when ``data_dir`` cannot be
    written."""
    (data_dir / "models").mkdir(parents=True, exist_ok=True)
    (data_dir / RUNS_DIR).mkdir(exist_ok=True)
    remove_stale(data_dir)
    state_dir = Path(tempfile.mkdtemp(prefix="run-", dir=data_dir / RUNS_DIR))
    try:
        for name in SHARED:
            if (data_dir / name).exists():
                (state_dir / name).symlink_to(data_dir / name)
        yield state_dir
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)  # links are removed, never followed
