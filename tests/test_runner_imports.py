"""A runner starts light: importing its main module imports no MLX, mlx-lm nor transformers
(seconds of CPU on a loaded machine before its first heartbeat and status). The builder of the
model's kind is imported when the runner is told to connect or load
(``worker.runner.builders``), by which time the preload has it (``worker.runner.startup``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_importing_the_runner_imports_no_mlx():
    code = (
        "import sys\n"
        "import worker.runner.main\n"
        "heavy = [m for m in ('mlx.core', 'mlx_lm', 'transformers', 'worker.engine.scheduler') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.unit
def test_the_decoder_builder_is_what_the_preload_imports():
    from worker.runner.builders import BUILDERS
    from worker.runner.startup import PRELOAD_MODULES

    assert BUILDERS["decoder"].partition(":")[0] in PRELOAD_MODULES
