"""A runner imports MLX, mlx-lm and transformers in the background from its start
(worker.runner.startup ``PRELOAD_MODULES``), so the import overlaps the lifecycle barriers
instead of following them (under scripts/chaos.py a re-placed 2-node instance spent
11-13 s between Connected and Loading on a loaded machine, importing).

Checked from outside on a real runner process that is given no task at all (not even its
setup): its memory map soon holds MLX's and the tokenizers' native libraries. Before the
fix a runner imported them only on its first ``LoadModel``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
BOUND = 60.0
"""Seconds the imports may take (about 1 s on a quiet machine; 2 shared cores under load)."""


def _mapped(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def test_an_idle_runner_has_loaded_mlx_and_the_tokenizer_libraries():
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.runner.main", "--in-fd", str(in_r), "--out-fd", str(out_w)],
        pass_fds=(in_r, out_w), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    os.close(in_r)
    os.close(out_w)
    try:
        deadline = time.monotonic() + BOUND
        maps = ""
        while time.monotonic() < deadline and proc.poll() is None:
            maps = _mapped(proc.pid)
            if "libmlx.so" in maps and "tokenizers" in maps:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the runner exited"
        assert "libmlx.so" in maps and "tokenizers" in maps, "no MLX / tokenizers library loaded without a task"
    finally:
        os.close(in_w)  # end of file: the runner exits on its own
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        os.close(out_r)
