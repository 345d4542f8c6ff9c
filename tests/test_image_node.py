"""Image generation against one real node serving the tiny FLUX.2-klein checkpoint
(docs/images.md): the ``openai`` client's ``images.generate`` (b64_json, url, a stream with 2
partial images, jpeg) and ``images.edit`` (one and streamed) give the pixels of mflux's own
pipelines run in process on the same checkpoint, seed and size; bad input (sizes, bombs, a
mask, a model that cannot edit) is a 400 in OpenAI's error shape."""

from __future__ import annotations

import base64

import httpx
import pytest

from tests.support.cluster import NodeProcess
from tests.support.image_oracle import oracle_edit_png, oracle_png, pixels, reference_png, tiny_checkpoint
from tests.support.models.synthetic_models import make_synthetic_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]  # a node, a runner compiling mflux's transformer
openai = pytest.importorskip("openai")

MODEL, PROMPT, TEXT_MODEL = "tiny-flux2", "a red fox in the snow", "tiny-text"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    import shutil

    models = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_checkpoint(tmp_path_factory), models / MODEL)
    make_synthetic_model(models / TEXT_MODEL, n_layers=1, hidden_size=32, intermediate_size=64, seed=1)  # never placed
    n = NodeProcess(tmp_path_factory.mktemp("node"), extra_args=["--models-dir", str(models)])
    try:
        n.start()
        n.place_and_wait(MODEL, timeout=240)
        n.models_dir = models  # type: ignore[attr-defined]
        yield n
    finally:
        n.stop()


def _client(node):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=240)


def test_b64_and_url_images_equal_mflux(node) -> None:
    want = pixels(oracle_png(node.models_dir / MODEL, prompt=PROMPT, seed=11, steps=2, width=64, height=48))
    got = _client(node).images.generate(model=MODEL, prompt=PROMPT, size="64x48", quality="low",
                                        extra_body={"seed": 11})
    assert got.output_format == "png" and got.size == "64x48" and got.usage is not None
    assert pixels(base64.b64decode(got.data[0].b64_json)) == want
    two = _client(node).images.generate(model=MODEL, prompt=PROMPT, size="64x48", quality="low", n=2,
                                        response_format="url", extra_body={"seed": 11})
    files = [httpx.get(d.url, timeout=30) for d in two.data]
    assert [f.status_code for f in files] == [200, 200] and files[0].headers["content-type"] == "image/png"
    assert pixels(files[0].content) == want and pixels(files[1].content) != want  # image 1: seed 12


def test_stream_sends_two_partials_then_the_image(node) -> None:
    want = pixels(oracle_png(node.models_dir / MODEL, prompt=PROMPT, seed=5, steps=4, width=32, height=32))
    events = list(_client(node).images.generate(model=MODEL, prompt=PROMPT, size="32x32", quality="medium",
                                                stream=True, partial_images=2, extra_body={"seed": 5}))
    assert [e.type for e in events] == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    assert pixels(base64.b64decode(events[-1].b64_json)) == want and events[-1].usage.total_tokens >= 1
    jpeg = _client(node).images.generate(model=MODEL, prompt=PROMPT, size="32x32", quality="low",
                                         output_format="jpeg", output_compression=90, extra_body={"seed": 5})
    assert base64.b64decode(jpeg.data[0].b64_json)[:3] == b"\xff\xd8\xff" and jpeg.output_format == "jpeg"


@pytest.mark.parametrize("body,param", [
    ({"size": "4096x4096"}, "size"), ({"size": "50x64"}, "size"), ({"n": 9}, "n"), ({"quality": "ultra"}, "quality"),
    ({"steps": 500}, "steps"), ({"partial_images": 2}, "partial_images"), ({"prompt": ""}, "prompt"),
    ({"output_compression": 101}, "output_compression"), ({"output_format": "gif"}, "output_format"),
])
def test_bad_input_is_a_400_in_openais_shape(node, body, param) -> None:
    r = httpx.post(f"{node.url}/v1/images/generations", json={"model": MODEL, "prompt": PROMPT, **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]
    kwargs = {"prompt": PROMPT, **body}
    extra = {"steps": kwargs.pop("steps")} if "steps" in kwargs else None  # not an OpenAI parameter
    with pytest.raises(openai.BadRequestError):
        _client(node).images.generate(model=MODEL, extra_body=extra, **kwargs)


def test_unknown_model_and_missing_file(node) -> None:
    with pytest.raises(openai.NotFoundError):
        _client(node).images.generate(model="no-such-model", prompt=PROMPT)
    assert httpx.get(f"{node.url}/v1/images/files/nothing.png", timeout=30).status_code == 404


def test_edit_equals_mflux_edit_and_streams(node, tmp_path) -> None:
    ref = reference_png(64, 48)
    want = pixels(oracle_edit_png(node.models_dir / MODEL, ref, prompt="make it blue", seed=3, steps=4, width=64,
                                  height=48, tmp=tmp_path))
    got = _client(node).images.edit(model=MODEL, image=("ref.png", ref, "image/png"), prompt="make it blue",
                                    extra_body={"seed": 3, "steps": 4})  # size auto: the image's own 64x48
    assert got.size == "64x48" and pixels(base64.b64decode(got.data[0].b64_json)) == want
    events = list(_client(node).images.edit(model=MODEL, image=("ref.png", ref, "image/png"), prompt="make it blue",
                                            stream=True, partial_images=2, extra_body={"seed": 3, "steps": 4}))
    assert [e.type for e in events] == ["image_edit.partial_image"] * 2 + ["image_edit.completed"]
    assert pixels(base64.b64decode(events[-1].b64_json)) == want


def _bomb() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("1", (20000, 20000)).save(out, format="PNG")  # 400 megapixels in a few kB
    return out.getvalue()


@pytest.mark.parametrize("files,data,param", [
    ({"image": ("bomb.png", "BOMB", "image/png")}, {}, "image"),
    ({"image": ("x.png", b"not an image", "image/png")}, {}, "image"),
    ({"image": ("x.gif", "GIF", "image/gif")}, {}, "image"),
    ({"image": ("x.png", "REF", "image/png"), "mask": ("m.png", "REF", "image/png")}, {}, "mask"),
    ({"image": ("x.png", "REF", "image/png")}, {"size": "4096x4096"}, "size"),
    ({"image": ("x.png", "REF", "image/png")}, {"model": TEXT_MODEL}, "model"),
    ({}, {}, "image"),
])
def test_bad_edits_are_400s(node, files, data, param) -> None:
    import io

    from PIL import Image

    gif = io.BytesIO()
    Image.new("RGB", (32, 32)).save(gif, format="GIF")
    real = {"BOMB": _bomb(), "GIF": gif.getvalue(), "REF": reference_png(32, 32)}
    files = {k: (n, real.get(b, b) if isinstance(b, str) else b, t) for k, (n, b, t) in files.items()}
    r = httpx.post(f"{node.url}/v1/images/edits", files=files or {"x": ("x", b"", "text/plain")},
                   data={"model": MODEL, "prompt": "edit", **data}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_cli_writes_the_image_and_edits(node, tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("exo-p2p")
    want = pixels(oracle_png(node.models_dir / MODEL, prompt=PROMPT, seed=11, steps=2, width=64, height=48))
    out = tmp_path / "fox.png"
    run = subprocess.run([str(exe), "image", MODEL, PROMPT, "-o", str(out), "--size", "64x48", "--steps", "2",
                          "--seed", "11", "--api", node.url], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"wrote {out} (64x48, png") and pixels(out.read_bytes()) == want
    ref = tmp_path / "ref.png"
    ref.write_bytes(reference_png(64, 48))
    edit_want = pixels(oracle_edit_png(node.models_dir / MODEL, ref.read_bytes(), prompt="blue", seed=3, steps=2,
                                       width=64, height=48, tmp=tmp_path))
    edited = tmp_path / "edited.png"
    run = subprocess.run([str(exe), "image", MODEL, "blue", "-o", str(edited), "--edit", str(ref), "--steps", "2",
                          "--seed", "3", "--api", node.url, "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert pixels(edited.read_bytes()) == edit_want and '"file": ' in run.stdout
    webp = tmp_path / "fox.webp"
    run = subprocess.run([str(exe), "image", MODEL, PROMPT, "-o", str(webp), "--size", "32x32", "--steps", "1",
                          "--api", node.url], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and webp.read_bytes()[8:12] == b"WEBP"
    bad = subprocess.run([str(exe), "image", MODEL, PROMPT, "-o", str(tmp_path / "x.gif"), "--api", node.url],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and ".png" in bad.stderr
    refused = subprocess.run([str(exe), "image", TEXT_MODEL, PROMPT, "-o", str(out), "--api", node.url],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "image" in refused.stderr


def _sse_events(response: httpx.Response) -> list[dict]:
    import json

    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_progress_events_come_after_every_step_of_a_generation_and_an_edit(node) -> None:
    """The extra ``progress: true`` (docs/images.md#progress): one event per denoising step,
    in order, before the image, whose pixels are still mflux's; an edit's form takes it too."""
    want = pixels(oracle_png(node.models_dir / MODEL, prompt=PROMPT, seed=9, steps=3, width=32, height=32))
    body = {"model": MODEL, "prompt": PROMPT, "size": "32x32", "steps": 3, "seed": 9, "stream": True,
            "progress": True, "partial_images": 1}
    with httpx.stream("POST", f"{node.url}/v1/images/generations", json=body, timeout=240) as r:
        events = _sse_events(r)
    assert [(e["type"], e.get("step")) for e in events] == [
        ("image_generation.progress", 1), ("image_generation.progress", 2), ("image_generation.partial_image", None),
        ("image_generation.progress", 3), ("image_generation.completed", None)]
    assert pixels(base64.b64decode(events[-1]["b64_json"])) == want and events[0]["steps"] == 3
    form = {"model": MODEL, "prompt": "blue", "steps": "2", "seed": "3", "stream": "true", "progress": "true"}
    with httpx.stream("POST", f"{node.url}/v1/images/edits", data=form, timeout=240,
                      files={"image": ("ref.png", reference_png(32, 32), "image/png")}) as r:
        kinds = [(e["type"], e.get("step")) for e in _sse_events(r)]
    assert kinds == [("image_edit.progress", 1), ("image_edit.progress", 2), ("image_edit.completed", None)]


def test_a_cancelled_stream_stops_its_runner_within_a_step(node) -> None:
    """A client that leaves a 50-step stream after its first partial image (step 12): the
    runner drops the image at its next step, so a one-step image asked next finishes in less
    time than the first partial took, not after the 38 steps left (checked to fail when the
    engine ignores cancels)."""
    import time

    from tests.support.image_streams import left_after_first_partial

    first_partial = left_after_first_partial(node.url, MODEL, PROMPT)
    started = time.monotonic()
    one = _client(node).images.generate(model=MODEL, prompt=PROMPT, size="32x32", extra_body={"steps": 1, "seed": 2})
    assert one.data[0].b64_json
    assert time.monotonic() - started < first_partial, (time.monotonic() - started, first_partial)


def test_a_runner_dying_mid_image_ends_the_stream_with_an_error(node) -> None:
    """Last in this module: it kills the image instance's runner. The stream, begun, ends with
    an ``error`` event within ``T_FAIL`` and slack of the death, never a hang."""
    import json
    import signal

    import psutil

    from tests.conftest import T_FAIL
    from tests.support.image_streams import killed_after_first_partial

    instance = next(i for i, v in node.get("/state", timeout=10).json()["instances"].items() if v["model_id"] == MODEL)
    pids = [json.loads(line)["pid"] for line in node.log_path.read_text(errors="replace").splitlines()
            if line.startswith("{") and '"runner started"' in line and instance in line]
    events, after = killed_after_first_partial(node.url, MODEL, PROMPT,
                                               lambda: psutil.Process(pids[-1]).send_signal(signal.SIGABRT))
    assert events[0] == "image_generation.partial_image" and events[-1] == "error", events
    assert "image_generation.completed" not in events
    assert after < T_FAIL + 10.0
