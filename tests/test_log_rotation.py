"""Log files rotate by size with copy and truncate (``exo_p2p.logs.rotation``): the writers'
append-mode descriptors keep working, and a log takes at most about twice its bound."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from exo_p2p.logs.rotation import rotate_if_larger, rotated_path, watch


def test_a_file_over_its_limit_is_copied_and_truncated(tmp_path):
    path = tmp_path / "node.log"
    path.write_bytes(b"a" * 100)
    assert not rotate_if_larger(path, 100), "at the limit: kept"
    path.write_bytes(b"b" * 101)
    assert rotate_if_larger(path, 100)
    assert path.read_bytes() == b"" and rotated_path(path).read_bytes() == b"b" * 101
    path.write_bytes(b"c" * 200)
    assert rotate_if_larger(path, 100)
    assert rotated_path(path).read_bytes() == b"c" * 200, "the older copy is replaced: one .1 file"
    assert not rotate_if_larger(tmp_path / "missing.log", 1)
    assert not rotate_if_larger(rotated_path(path), 0), "limit 0: never"


def test_an_append_mode_writer_goes_on_at_the_new_end(tmp_path):
    """What the node's and its runners' shared descriptors do after a rotation: the next
    line lands at offset 0 of the truncated file, no hole of zero bytes before it."""
    path = tmp_path / "node.log"
    with open(path, "a", buffering=1) as writer:
        writer.write("x" * 500 + "\n")
        assert rotate_if_larger(path, 100)
        writer.write("after\n")
    assert path.read_text() == "after\n"
    assert rotated_path(path).read_text() == "x" * 500 + "\n"


def test_the_watch_rotates_a_log_that_passes_its_bound(tmp_path):
    """Three times over: a log written past its bound is rotated by the watch within 5 s
    (checks every 0.01 s; 5 s is slack for a loaded machine), and what was written is in the
    ``.1`` copy."""
    path = tmp_path / "node.log"
    stop = threading.Event()
    watch(path, limit=4096, every=0.01, stop=stop)
    try:
        with open(path, "a", buffering=1) as writer:
            for round_ in range(3):
                text = "".join(f"round {round_} line {i:04d}\n" for i in range(300))  # ~6 KB
                writer.write(text)
                deadline = time.monotonic() + 5.0
                while path.stat().st_size and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert path.stat().st_size == 0, f"round {round_}: not rotated within 5 s"
                assert rotated_path(path).read_text() == text
    finally:
        stop.set()


@pytest.mark.integration
def test_a_child_process_writing_through_inherited_stderr_follows_the_truncation(tmp_path):
    """A runner writes to the node's log through fd 2 inherited from the node: after a
    rotation its lines land at the start of the file, not past a hole."""
    path = tmp_path / "node.log"
    with open(path, "a", buffering=1) as log:
        child = subprocess.Popen([sys.executable, "-c",
                                  "import sys, time\nfor i in range(4):\n    sys.stderr.write('y' * 300 + '\\n'); sys.stderr.flush(); time.sleep(0.3)"],
                                 stderr=log)
        time.sleep(0.45)
        rotated = rotate_if_larger(path, 100)
        child.wait(timeout=30)
    assert rotated
    size = os.path.getsize(path)
    assert size in (301 * 2, 301 * 3) and b"\0" not in path.read_bytes(), size
