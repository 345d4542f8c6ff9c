"""The environment a CLI subprocess runs in, without the caller's settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXO_P2P_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env
