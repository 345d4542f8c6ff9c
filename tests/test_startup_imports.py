"""A node's start-up path stays light (a restarted node rejoins in seconds).

Carding its models is on the path to a restarted node's profile being indexed. It asked
mlx-lm whether a model type supports tensor sharding (``Model.shard``) by importing it,
~2 s of CPU with transformers (more on a loaded machine): the node rejoined that much later.
``exo_p2p.models.card.derive.shard_method_in_source`` reads the answer from mlx-lm's source instead.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_listing_a_nodes_models_does_not_import_mlx_lm(tmp_path):
    """A store holding a synthetic llama model and the embedded GGUF (a llama too) is carded
    in a fresh process without mlx-lm (nor transformers) being imported."""
    from tests.support.models.synthetic_models import make_synthetic_model

    models = tmp_path / "models"
    make_synthetic_model(models / "tiny", n_layers=2, hidden_size=32, intermediate_size=64, seed=1)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from exo_p2p.models.stores.store import ModelStore\n"
        f"store = ModelStore(Path({str(tmp_path / 'data')!r}), [Path({str(models)!r})])\n"
        "cards = store.list_cards()\n"
        "assert any(c.model_id == 'tiny' for c in cards), [c.model_id for c in cards]\n"
        "heavy = sorted(m for m in ('mlx_lm', 'transformers') if m in sys.modules)\n"
        "print('heavy=' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    heavy = [line for line in out.stdout.splitlines() if line.startswith("heavy=")]
    assert heavy == ["heavy="], f"carding imported {heavy}"


def test_the_source_reading_agrees_with_mlx_lm_for_every_model_type():
    """For every model module of the installed mlx-lm, the answer read from source (when it
    gives one) is what importing mlx-lm says; llama (and mistral, remapped to llama) answer."""
    from mlx_lm.utils import _get_classes

    from exo_p2p.models.card.derive import shard_method_in_source

    assert shard_method_in_source("llama") is True and shard_method_in_source("mistral") is True
    assert shard_method_in_source("no_such_model_type") is None
    assert shard_method_in_source("../utils") is None
    root = Path(next(iter(importlib.util.find_spec("mlx_lm").submodule_search_locations)))
    checked = 0
    for path in sorted((root / "models").glob("*.py")):
        plain = shard_method_in_source(path.stem)
        if plain is None or path.stem == "olmo":  # olmo's module exits without ai2-olmo
            continue
        try:
            model_class, _ = _get_classes({"model_type": path.stem})
        except (ImportError, ValueError, AttributeError):
            continue
        assert plain == callable(getattr(model_class, "shard", None)), path.stem
        checked += 1
    assert checked >= 20, checked
