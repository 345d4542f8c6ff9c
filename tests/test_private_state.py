"""The private node of ``exo-p2p run`` starts from a fresh state dir that shares the data
dir's models and config (exo_p2p/cli/chat/private_state.py): it never adopts the event log of
another cluster that used the same data dir (a node of the README's two-node tour, whose
State named a peer that was gone: ``run`` failed on an instance of it)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from exo_p2p.cli.chat.private_state import RUNS_DIR, STALE_AFTER, private_state, remove_stale, unused


def data_dir_of_a_tour_node(tmp_path: Path) -> Path:
    data = tmp_path / "exo-p2p"
    (data / "models" / "smollm2-135m-instruct").mkdir(parents=True)
    (data / "events.log").write_bytes(b"the two-node tour's log")
    (data / "identity.key").write_bytes(b"key")
    (data / "config.toml").write_text("max-batch = 4\n")
    return data


def test_the_private_node_gets_a_fresh_state_that_shares_models_and_config(tmp_path: Path) -> None:
    data = data_dir_of_a_tour_node(tmp_path)
    with private_state(data) as state:
        assert state.parent == data / RUNS_DIR
        assert not (state / "events.log").exists() and not (state / "identity.key").exists()
        assert (state / "models").resolve() == (data / "models").resolve()
        assert (state / "config.toml").read_text() == "max-batch = 4\n"
        (state / "models" / "pulled").mkdir()  # what the node writes lands in the data dir
        (state / "events.log").write_bytes(b"the run's own log")
    assert not state.exists()
    assert (data / "models" / "pulled").is_dir() and (data / "models" / "smollm2-135m-instruct").is_dir()
    assert (data / "events.log").read_bytes() == b"the two-node tour's log"  # untouched


def test_a_fresh_data_dir_gets_a_models_folder_and_no_config_link(tmp_path: Path) -> None:
    with private_state(tmp_path / "new") as state:
        assert (state / "models").is_dir() and not (state / "config.toml").exists()


def test_state_dirs_of_killed_runs_are_removed_once_no_node_holds_them(tmp_path: Path) -> None:
    data = data_dir_of_a_tour_node(tmp_path)
    runs = data / RUNS_DIR
    old, held, young = runs / "run-old", runs / "run-held", runs / "run-young"
    for d in (old, held, young):
        d.mkdir(parents=True)
        (d / "node.lock").write_text("123")
    long_ago = time.time() - STALE_AFTER - 10
    for d in (old, held):
        os.utime(d, (long_ago, long_ago))
    with open(held / "node.lock", "a+") as lock:  # a live node of another run holds it
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert not unused(held) and unused(old)
        assert remove_stale(data) == [old]
    assert held.is_dir() and young.is_dir()  # young: its run may not have started its node yet
