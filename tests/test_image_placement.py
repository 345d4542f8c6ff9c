"""Placement of image models (docs/images.md#placement): the card's parts (blocks as layers,
text encoder + VAE on rank 0, the transformer's shared modules on every rank, the VAE decode as
rank 0's working memory) and the pipeline shares with 10 % headroom on every rank."""

from __future__ import annotations

import msgspec
import pytest

from master.placement.split import Overflow, headroom_bytes, pipeline_shares
from tests.support.image_oracle import tiny_checkpoint

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def card(tmp_path_factory: pytest.TempPathFactory):
    from exo_p2p.images.card import image_card

    return image_card(tiny_checkpoint(tmp_path_factory), "tiny-flux2")


def test_card_parts_add_up(card) -> None:
    from exo_p2p.images.card import decode_bytes

    ckpt_bytes = card.storage_size
    assert sum(card.layer_bytes) + card.embedding_bytes + card.shared_bytes == ckpt_bytes
    assert card.shared_bytes > 0 and card.embedding_bytes > 0 and card.head_bytes == 0
    assert card.work_bytes == decode_bytes({"block_out_channels": [32, 32, 32, 32]}) > 0


def test_decode_bytes_bound_the_measured_decode() -> None:
    """The decode bound is above the peak measured for the tiny VAE (32 channels) at 512²
    (211 MB with mflux 0.24 on CPU) and grows with the pixels and the channels."""
    from exo_p2p.images.card import decode_bytes

    assert decode_bytes({"block_out_channels": [32]}, 512 * 512) >= 211_011_078
    assert decode_bytes({"block_out_channels": [128]}, 1024 * 1024) > decode_bytes({"block_out_channels": [32]}, 1024 * 1024)


def test_one_node_needs_the_whole_pipeline_and_its_decode(card) -> None:
    whole = card.storage_size + card.work_bytes
    assert isinstance(pipeline_shares(card, [headroom_bytes(whole) - 1]), Overflow)
    (share,) = pipeline_shares(card, [headroom_bytes(whole)])
    assert share.share_bytes == whole and (share.start_layer, share.end_layer) == (0, card.n_layers)


def test_two_nodes_split_the_blocks(card) -> None:
    """Rank 0: text encoder, VAE, shared modules, decode and its blocks; rank 1: shared modules
    and its blocks; each with 10 % headroom."""
    big = 10 * (card.storage_size + card.work_bytes)
    shares = pipeline_shares(card, [big, big])
    assert not isinstance(shares, Overflow)
    first, second = shares
    assert (first.start_layer, first.end_layer, second.end_layer) == (0, first.end_layer, card.n_layers)
    assert 0 < first.end_layer < card.n_layers
    blocks = card.layer_bytes
    assert first.share_bytes == (card.embedding_bytes + card.shared_bytes + card.work_bytes
                                 + sum(blocks[: first.end_layer]))
    assert second.share_bytes == card.shared_bytes + sum(blocks[first.end_layer :])
    tight = pipeline_shares(card, [big, headroom_bytes(second.share_bytes) - 1])
    assert isinstance(tight, Overflow) or tight[1].end_layer - tight[1].start_layer < second.end_layer - second.start_layer


def test_headroom_is_per_rank_for_image_cards_only(card) -> None:
    """A text card keeps the cycle-total headroom rule: its ranks may fill their usable bytes."""
    text = msgspec.structs.replace(card, work_bytes=0, shared_bytes=0, tasks=("generate",))
    need = text.storage_size
    assert not isinstance(pipeline_shares(text, [need]), Overflow)
    assert isinstance(pipeline_shares(card, [card.storage_size + card.work_bytes]), Overflow)
