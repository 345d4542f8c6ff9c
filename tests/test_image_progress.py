"""Per-step progress of an image (docs/images.md#progress): the runner's work sends an
``ImageProgressChunk`` after every step only when asked, the request field's rules, and
``exo-p2p image``'s reading of the stream with its bar."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from exo_p2p.api.errors import ApiError
from exo_p2p.api.images.request import parse_generation
from exo_p2p.cli.chat.image_progress import follow
from exo_p2p.cli.errors import CliError
from exo_p2p.types import FinishChunk, ImageChunk, ImageGeneration, ImageParams, ImageProgressChunk

pytestmark = pytest.mark.unit


class _Run:
    """A run of ``steps`` steps whose images are 1-pixel PIL images (no model)."""

    def __init__(self, steps: int) -> None:
        self.steps, self.done_steps = steps, 0

    @property
    def finished(self) -> bool:
        return self.done_steps >= self.steps

    def step(self) -> None:
        self.done_steps += 1

    def preview(self):  # noqa: ANN201
        from PIL import Image

        return Image.new("RGB", (1, 1))

    image = preview


def _chunks(progress: bool, steps: int = 4, partials: int = 1) -> list:
    from worker.image.work import ImageWork

    work = ImageWork(lambda task: _Run(task.params.steps))
    params = ImageParams(prompt="p", width=64, height=64, steps=steps, seed=1, partial_images=partials, progress=progress)
    work.submit(ImageGeneration(task_id="t", instance_id="i", model_id="m", params=params, api_node_id="n"))
    out: list = []
    for _ in range(20):
        if not work.has_work():
            return out
        out += work.step()
    raise AssertionError("the work did not end in 20 steps")


def test_progress_after_every_step_only_when_asked() -> None:
    asked = _chunks(progress=True)
    assert [(c.step, c.steps) for c in asked if isinstance(c, ImageProgressChunk)] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    kinds = [type(c).__name__ for c in asked]
    assert kinds == ["ImageProgressChunk", "ImageProgressChunk", "ImageChunk", "ImageProgressChunk",
                     "ImageProgressChunk", "ImageChunk", "FinishChunk"]
    assert isinstance(asked[-1], FinishChunk) and isinstance(asked[-2], ImageChunk)
    assert not [c for c in _chunks(progress=False) if isinstance(c, ImageProgressChunk)]


def test_the_progress_field_needs_a_stream() -> None:
    body = {"model": "m", "prompt": "p", "size": "64x64"}
    assert parse_generation(json.dumps({**body, "stream": True, "progress": True}).encode()).params.progress
    assert not parse_generation(json.dumps(body).encode()).params.progress
    with pytest.raises(ApiError) as err:
        parse_generation(json.dumps({**body, "progress": True}).encode())
    assert err.value.info.status == 400 and err.value.info.param == "progress"


def _events(*events: dict) -> list[str]:
    return [json.dumps(e) for e in events]


def test_the_cli_draws_a_bar_per_step_and_returns_the_image() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    steps = [{"type": "image_generation.progress", "step": s, "steps": 3, "image_index": 0} for s in (1, 2, 3)]
    done = {"type": "image_generation.completed", "b64_json": "aGk=", "size": "64x64", "output_format": "png"}
    answer = follow(_events(*steps, done), None, console)
    assert answer["data"] == [{"b64_json": "aGk="}] and answer["size"] == "64x64"
    drawn = out.getvalue()
    assert all(f"{s}/3" in drawn for s in (1, 2, 3)), drawn


def test_the_cli_reports_a_stream_error_or_a_stream_without_its_image() -> None:
    console = Console(file=io.StringIO())
    with pytest.raises(CliError, match="runner died"):
        follow(_events({"type": "error", "error": {"message": "the runner died"}}), 4, console)
    with pytest.raises(CliError, match="without the image"):
        follow(_events({"type": "image_generation.progress", "step": 1, "steps": 4}), 4, console)
    with pytest.raises(CliError, match="not JSON"):
        follow(["{"], 4, console)
