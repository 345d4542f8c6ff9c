"""Image models' rules (docs/images.md): the card from the files, the kind, the master's
admission and the request bounds."""

from __future__ import annotations

import json

import pytest

from exo_p2p.images.bounds import ImageBoundError, check_params, parse_size
from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.types import ImageGeneration, ImageParams, TextGeneration
from exo_p2p.types.images import partial_steps
from exo_p2p.types.kinds import image_tasks, model_kind, model_tasks
from tests.support.image_oracle import tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    return tiny_checkpoint(tmp_path_factory)


def test_card_counts_transformer_blocks_as_layers(ckpt) -> None:
    from exo_p2p.images.card import image_card
    from tests.support.models.synthetic_flux2 import TINY_TRANSFORMER

    card = image_card(ckpt, "tiny-flux2")
    import struct

    files = sum(p.stat().st_size - 8 - struct.unpack("<Q", p.read_bytes()[:8])[0] for p in ckpt.glob("*/*.safetensors"))
    assert card.n_layers == TINY_TRANSFORMER["num_layers"] + TINY_TRANSFORMER["num_single_layers"]
    assert card.tasks == ("image", "image_edit") and not card.supports_tensor
    assert card.storage_size == sum(card.layer_bytes) + card.embedding_bytes + card.shared_bytes
    assert card.storage_size == files  # every tensor's bytes (each file less its header)
    assert card.layer_bytes[0] > card.layer_bytes[-1]  # a double-stream block holds two streams


def test_card_refuses_other_pipelines_and_missing_parts(ckpt, tmp_path) -> None:
    import shutil

    from exo_p2p.images.card import image_card

    other = tmp_path / "other"
    shutil.copytree(ckpt, other)
    (other / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(UnsupportedModelError, match="not one the image runner builds"):
        image_card(other, "x")
    (other / "model_index.json").write_text(json.dumps({"_class_name": "Flux2KleinPipeline"}))
    for f in (other / "vae").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(UnsupportedModelError, match="vae"):
        image_card(other, "x")


def test_kind_and_tasks_from_files(ckpt) -> None:
    from worker.runner.builders import BUILDERS, kind_of_model

    index = {"_class_name": "Flux2KleinPipeline"}
    assert model_kind(index, ["model_index.json"]) == "image" and kind_of_model(str(ckpt)) == "image"
    assert model_tasks(index, ["model_index.json"]) == ("image", "image_edit")
    assert image_tasks({"_class_name": "Other"}) == () and "image" in BUILDERS


def _image_task(**params) -> ImageGeneration:
    p = {"prompt": "fox", "width": 64, "height": 64, "steps": 2, "seed": 1, **params}
    return ImageGeneration(task_id="t", instance_id="", model_id="m", params=ImageParams(**p), api_node_id="n")


def test_master_admits_images_by_the_card(ckpt) -> None:
    from exo_p2p.images.card import image_card
    from master.task_kinds import oversized_input, prefill_tokens, split_refusal, unsupported_task

    card = image_card(ckpt, "tiny-flux2")
    task = _image_task(prompt="x" * 5000)
    assert unsupported_task(card, task) is None and oversized_input(card, task) is None
    assert prefill_tokens(card, task) == card.context_length
    refused = unsupported_task(card, _Text())
    assert refused is not None and refused.code == "unsupported_task" and "image" in refused.message
    assert split_refusal(card, _Instance(2)) is None  # blocks split as a pipeline (tests/test_image_placement.py)
    assert split_refusal(card, _Instance(1)) is None


class _Text:
    task_kind = TextGeneration.task_kind  # only its kind is read


class _Instance:
    def __init__(self, n: int) -> None:
        self.shards = dict.fromkeys(range(n))


@pytest.mark.parametrize("size,want", [("auto", (1024, 1024)), ("64x48", (64, 48)), ("1024X1536", (1024, 1536))])
def test_sizes_parse(size, want) -> None:
    assert parse_size(size) == want


@pytest.mark.parametrize("size", ["64", "50x64", "4096x4096", "2048x2048", "0x64", "-16x64", "axb", "99999999x16"])
def test_bad_sizes_are_refused(size) -> None:
    with pytest.raises(ImageBoundError) as e:
        parse_size(size)
    assert e.value.param == "size"


@pytest.mark.parametrize("field,value", [("steps", 0), ("steps", 51), ("partial_images", 4), ("prompt", " "),
                                         ("seed", -1)])
def test_params_over_bounds(field, value) -> None:
    with pytest.raises(ImageBoundError) as e:
        check_params(_image_task(**{field: value}).params)
    assert e.value.param == field


def test_partial_steps_are_spread_and_before_the_last() -> None:
    assert partial_steps(4, 2) == (1, 3) and partial_steps(10, 3) == (2, 5, 8)
    assert partial_steps(2, 3) == (1,) and partial_steps(1, 1) == () and partial_steps(4, 0) == ()
