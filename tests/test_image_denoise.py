"""The image runner's stepwise FLUX.2-klein run against mflux's own pipeline (docs/images.md#steps)."""

from __future__ import annotations

import pytest

from tests.support.image_oracle import oracle_png, pixels, png_bytes, tiny_checkpoint

pytestmark = pytest.mark.timeout(240)  # mflux compiles the transformer call on first use (~10 s idle, more under load)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    return tiny_checkpoint(tmp_path_factory)


def test_stepwise_run_equals_mflux_pipeline(ckpt) -> None:
    from worker.image.denoise import ImageRun
    from worker.image.load import load_pipeline

    want = oracle_png(ckpt, prompt="a red fox", seed=7, steps=3, width=64, height=48)
    run = ImageRun(load_pipeline(ckpt), prompt="a red fox", seed=7, steps=3, width=64, height=48)
    seen = []
    while not run.finished:
        run.step()
        seen.append(run.done_steps)
    got = png_bytes(run.image())
    assert seen == [1, 2, 3]
    assert run.image().size == (64, 48)
    assert pixels(got) == pixels(want)


def test_other_seed_gives_other_pixels(ckpt) -> None:
    from worker.image.denoise import ImageRun
    from worker.image.load import load_pipeline

    pipeline = load_pipeline(ckpt)
    images = []
    for seed in (1, 2):
        run = ImageRun(pipeline, prompt="a red fox", seed=seed, steps=1, width=32, height=32)
        run.step()
        images.append(pixels(png_bytes(run.image())))
    assert images[0] != images[1]
    with pytest.raises(RuntimeError):
        run.step()


def test_loader_reads_sizes_and_refuses_missing_config(ckpt, tmp_path) -> None:
    from worker.image.load import ImageModelError, read_sizes

    sizes = read_sizes(ckpt)
    assert sizes.transformer["num_layers"] == 2 and sizes.vae_channels == (32, 32, 32, 32)
    with pytest.raises(ImageModelError, match="transformer/config.json"):
        read_sizes(tmp_path)
