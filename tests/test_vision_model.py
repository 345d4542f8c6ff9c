"""The tiny random Qwen2-VL (``tests.support.models.synthetic_vlm``): mlx-vlm loads it and its
greedy ``generate`` (the oracle the vision engine's tokens must equal) is deterministic and
depends on the image; its card lists the ``vision`` capability, and the API and the CLI show
it. Reading images on the API never imports mlx-vlm (README command 1 stays light)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from exo_p2p.api.views import local_model, model_entry
from exo_p2p.cli.output.render import models_table
from exo_p2p.models.card.derive import card_from_model_dir
from tests.support.images.samples import image_bytes
from tests.support.models.synthetic_vlm import make_synthetic_vlm

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")


@pytest.mark.unit
def test_the_synthetic_vlm_card_lists_vision_and_the_api_and_cli_show_it(vlm: Path) -> None:
    card = card_from_model_dir(vlm, "tiny-qwen2-vl")
    assert "vision" in card.capabilities and "generate" in card.tasks
    assert "vision" in model_entry(card, 0).capabilities and "vision" in local_model(card).capabilities
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(models_table([{"model": "tiny-qwen2-vl", "tasks": ["generate"], "capabilities": ["completion", "vision"]}]))
    assert "generate + vision" in console.export_text()


def _oracle(model_dir: Path, image: bytes, max_tokens: int = 10) -> list[int]:
    """mlx-vlm's own greedy generation on ``image`` and one question: its token ids."""
    from mlx_vlm import generate, load
    from mlx_vlm.prompt_utils import apply_chat_template
    from PIL import Image

    model, processor = load(str(model_dir))
    prompt = apply_chat_template(processor, model.config, "What is in the picture?", num_images=1)
    result = generate(model, processor, prompt, image=[Image.open(io.BytesIO(image))], max_tokens=max_tokens,
                      temperature=0.0, verbose=False)
    return list(result.token_ids)


@pytest.mark.unit
def test_mlx_vlm_greedy_generate_on_the_synthetic_vlm_is_the_oracle(vlm: Path) -> None:
    png, jpeg = image_bytes("PNG", (64, 48)), image_bytes("JPEG", (64, 48))
    first = _oracle(vlm, png)
    assert len(first) == 10 and _oracle(vlm, png) == first  # greedy: the same tokens every time
    other = _oracle(vlm, image_bytes("PNG", (64, 48), color=(10, 220, 30)))
    assert other != first  # the vision tower's features reach the language model
    assert len(_oracle(vlm, jpeg)) == 10


@pytest.mark.integration
def test_reading_images_on_the_api_never_imports_mlx_vlm() -> None:
    code = (
        "import sys\n"
        "from exo_p2p.api.app import create_app\n"
        "from exo_p2p.api.families.openai.chat import chat_params\n"
        "from exo_p2p.api.schemas import ChatCompletionRequest\n"
        "from tests.support.images.samples import data_url, image_bytes\n"
        "part = {'type': 'image_url', 'image_url': {'url': data_url(image_bytes())}}\n"
        "r = ChatCompletionRequest(model='m', messages=[{'role': 'user', 'content': [part]}])\n"
        "import msgspec; r = msgspec.convert(msgspec.to_builtins(r), ChatCompletionRequest)\n"
        "assert chat_params(r).messages[0].images\n"
        "print('heavy=' + ','.join(sorted(m for m in ('mlx_vlm', 'transformers', 'cv2') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "heavy=" in out.stdout.splitlines(), out.stdout
