"""A replayed 8-turn agent session (a ~6k-token system prompt) whose engine is rebuilt — a
runner restart: RAM empty, the disk tier's directory kept — between turns 4 and 5: with the
disk tier, turn 5 restores the session from disk (TTFT ≤ 1/5 of a cold prefill's) and every
answer equals the run without the tier; a corrupted block, a block of another model and a
full disk (a small tmpfs) each fall back to prefill with the same answers and a logged
reason."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from exo_p2p.types.engine import EngineSettings
from tests.support.agent_session import replay, serve, session_messages, system_prompt
from worker.engine.builder import build_engine
from worker.runner.stats import engine_stats
from worker.engine.cache.block import decode, encode, read_header

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
CACHE = 64 << 20
SYSTEM = system_prompt(6000)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.support.models.synthetic_models import make_synthetic_model
    from worker.engine.loading.loader import load_all

    return load_all(make_synthetic_model(tmp_path_factory.mktemp("agent") / "synthetic", n_layers=4,
                                         context_length=16384))


def engine(loaded, directory: Path | None = None, disk: int = CACHE):
    settings = EngineSettings(prefill_chunk_size=512, prompt_cache_bytes=CACHE,
                              prompt_cache_disk_bytes=disk if directory else 0,
                              prompt_cache_dir=str(directory) if directory else "")
    return build_engine(loaded, settings)


@pytest.fixture(scope="module")
def reference(loaded) -> list[str]:
    """The 8 answers without the disk tier (RAM prompt cache on, no restart)."""
    answers: list[str] = []
    turns = replay(engine(loaded), SYSTEM, range(8), answers)
    assert 6000 <= turns[0].prompt_tokens <= 6600, turns[0].prompt_tokens
    return answers


def first_half(loaded, directory: Path) -> list[str]:
    """Turns 1–4 with the disk tier, then the engine is shut as a runner's is (writes flushed)."""
    answers: list[str] = []
    gen = engine(loaded, directory)
    replay(gen, SYSTEM, range(4), answers)
    gen.prompt_cache.disk.close()
    return answers


def test_turn_5_after_a_restart_is_restored_from_disk(loaded, reference, tmp_path: Path) -> None:
    answers = first_half(loaded, tmp_path)
    assert answers == reference[:4]
    cold = serve(engine(loaded), "cold", session_messages(SYSTEM, 4, reference))  # a cold prefill of turn 5
    gen = engine(loaded, tmp_path)  # restarted: RAM empty, the blocks on disk
    turns = replay(gen, SYSTEM, range(4, 8), answers)
    cache = gen.prompt_cache
    assert answers == reference and cold.text == reference[4]
    assert cache.disk_hits == 1 and cache.restored_tokens >= 6000
    stats = engine_stats(gen, 0)  # what the runner reports (exo_prompt_cache_disk_* metrics)
    assert stats.cache_disk_hits_total == 1 and stats.cache_restored_tokens_total == cache.restored_tokens
    assert stats.cache_disk_bytes > 0 and stats.cache_disk_blocks >= 4 and stats.cache_disk_writable
    assert turns[0].ttft <= cold.ttft / 5, (turns[0].ttft, cold.ttft)
    print(f"turn 5 TTFT restored {turns[0].ttft * 1000:.0f} ms, cold prefill {cold.ttft * 1000:.0f} ms "
          f"({turns[0].prompt_tokens} prompt tokens, {cache.restored_tokens} restored)")
    cache.disk.close()


def fallback(loaded, directory: Path, reference: list[str], answers: list[str]) -> None:
    gen = engine(loaded, directory)
    replay(gen, SYSTEM, range(4, 8), answers)
    assert answers == reference and gen.prompt_cache.disk_hits == 0
    gen.prompt_cache.disk.close()


def blocks(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.kvb"))


def test_a_corrupted_block_falls_back_to_prefill(loaded, reference, tmp_path: Path, caplog) -> None:
    answers = first_half(loaded, tmp_path)
    for path in blocks(tmp_path):
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        fallback(loaded, tmp_path, reference, answers)
    assert "(checksum)" in caplog.text


def test_a_block_of_another_model_falls_back_to_prefill(loaded, reference, tmp_path: Path, caplog) -> None:
    answers = first_half(loaded, tmp_path)
    for path in blocks(tmp_path):  # the same tokens' blocks, rewritten whole (valid checksum) as another model's
        data = path.read_bytes()
        header = read_header(data)
        _, arrays = decode(data, header.identity, header.layers, header.tenant)
        path.write_bytes(encode(("f" * 64, header.layers, header.tenant, header.tokens), arrays))
    with caplog.at_level(logging.WARNING):
        fallback(loaded, tmp_path, reference, answers)
    assert "(model: written for ffff" in caplog.text


def test_a_full_disk_stops_writing_and_serving_goes_on(loaded, reference, tmp_path: Path, caplog) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        with caplog.at_level(logging.WARNING):
            answers = first_half(loaded, mount)
            assert "stopped writing" in caplog.text
            assert answers == reference[:4]
            fallback(loaded, mount, reference, answers)
    finally:
        subprocess.run(["umount", str(mount)], check=False)
