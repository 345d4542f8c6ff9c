"""What the image tests share (docs/images.md#testing): the tiny FLUX.2-klein checkpoint made
once per session, and the oracle, mflux's own ``generate_image`` run in process on it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

mflux = pytest.importorskip("mflux", reason="mflux is installed by scripts/install.sh --test or --images")


def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint (``tests.support.models.synthetic_flux2``) in a session directory."""
    from tests.support.models.synthetic_flux2 import make_tiny_flux2

    root = tmp_path_factory.getbasetemp() / "tiny-flux2"
    if not (root / "model_index.json").is_file():
        make_tiny_flux2(root, seed=0)
    return root


def oracle_png(model_dir: Path, *, prompt: str, seed: int, steps: int, width: int, height: int) -> bytes:
    """The PNG bytes of mflux's ``Flux2Klein.generate_image`` on ``model_dir`` (loaded by the
    runner's initializer; the generation is mflux's) for the same request."""
    from worker.image.load import load_pipeline

    pipeline = load_pipeline(model_dir)
    image = pipeline.generate_image(seed=seed, prompt=prompt, num_inference_steps=steps, height=height, width=width)
    return png_bytes(image.image)


def oracle_edit_png(model_dir: Path, reference: bytes, *, prompt: str, seed: int, steps: int, width: int,
                    height: int, tmp: Path) -> bytes:
    """The PNG bytes of mflux's ``Flux2KleinEdit.generate_image`` on ``model_dir`` editing
    ``reference`` (image bytes, written to ``tmp``)."""
    from worker.image.load import load_pipeline

    path = tmp / "reference.img"
    path.write_bytes(reference)
    image = load_pipeline(model_dir, edit=True).generate_image(
        seed=seed, prompt=prompt, num_inference_steps=steps, height=height, width=width, image_paths=[str(path)])
    return png_bytes(image.image)


def reference_png(width: int = 64, height: int = 48) -> bytes:
    """A deterministic RGB test picture as PNG bytes (a gradient)."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 256], -1).astype("uint8")
    return png_bytes(Image.fromarray(rgb))


def png_bytes(image: object) -> bytes:
    """``image`` (PIL) as PNG bytes without metadata."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")  # type: ignore[attr-defined]
    return buf.getvalue()


def pixels(png: bytes) -> bytes:
    """The RGB pixel bytes of a PNG/JPEG/WebP image (so files that differ only in metadata compare equal)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return im.convert("RGB").tobytes()
