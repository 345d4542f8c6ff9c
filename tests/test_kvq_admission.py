"""``--kv-cache-bits`` as a rank setting: the placing master fixes it in the instance, every
runner uses it, and the master's memory admission counts the quantized KV bytes the ranks
hold (``master.admission.kv_bytes_per_token``, ``exo_p2p.models.kv_bytes``); the flag refuses
other values."""

from __future__ import annotations

import msgspec
import pytest

from exo_p2p.settings.apply import checked
from exo_p2p.settings.table import SETTINGS
from exo_p2p.state import apply
from exo_p2p.types import GenerationParams, IndexedEvent, InstanceCreated, ModelCard, PlaceInstance, RankSettings
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.tasks import ChatMessage
from master.admission import kv_bytes_per_token, memory_refusal, rank_needs
from master.commands import handle_command
from tests.support.rules.placement_cluster import card, cluster

pytestmark = pytest.mark.unit
GIB = 1 << 30


def placed(bits: int, memory: int = 8 * GIB):
    state = cluster([(memory, memory), (memory, memory)])
    state = msgspec.structs.replace(state, model_cards={"m": card(4, GIB, heads=4, kv=2, hidden=256)})
    decision = handle_command(state, PlaceInstance("p1", "m", min_nodes=2), rank_settings=RankSettings(16, 4, bits))
    (created,) = decision.events
    assert isinstance(created, InstanceCreated)
    return apply(state, IndexedEvent(1, 1, created)), created.instance


def test_the_instance_carries_the_bits_and_every_runner_uses_them() -> None:
    _, instance = placed(8)
    assert instance.settings is not None and instance.settings.kv_cache_bits == 8
    for node_bits in (0, 4, 8):
        ran = EngineSettings(kv_cache_bits=node_bits).for_runner(instance.settings, None)
        assert ran.kv_cache_bits == 8
    assert EngineSettings(kv_cache_bits=4).rank_settings().kv_cache_bits == 4
    with pytest.raises(ValueError, match="kv_cache_bits"):
        EngineSettings(kv_cache_bits=3).check()


def test_the_flag_takes_0_8_or_4() -> None:
    setting = next(s for s in SETTINGS.values() if s.flag == "--kv-cache-bits")
    assert [checked(setting, v) for v in ("0", "8", "4")] == [0, 8, 4]
    with pytest.raises(Exception, match="must be 0, 8 or 4"):
        checked(setting, "2")


def test_smollm2_q8_kv_is_68_of_128_bytes_a_vector() -> None:
    smol = ModelCard("s", 30, 576, 9, 3, 49152, 8192, 1, (1,) * 30, 0, 0, 0, True, activation_dtype_bytes=2)
    assert kv_bytes_per_token(smol, bits=8) == 30 * 3 * 2 * (64 + 2 * 2)
    assert kv_bytes_per_token(smol, bits=4) == 30 * 3 * 2 * (32 + 2 * 2)
    assert kv_bytes_per_token(smol) / kv_bytes_per_token(smol, bits=8) > 1.88
    odd = msgspec.structs.replace(smol, head_dim=80)  # the quantized cache refuses it: counted at full precision
    assert kv_bytes_per_token(odd, bits=8) == kv_bytes_per_token(odd)


def test_admission_counts_the_quantized_bytes() -> None:
    params = GenerationParams((ChatMessage("user", "word " * 1500),), max_tokens=1)  # type: ignore[arg-type]
    full_state, full = placed(0)
    q_state, q8 = placed(8)
    need_full = rank_needs(full_state, full, full_state.model_cards["m"], 1000)
    need_q8 = rank_needs(q_state, q8, q_state.model_cards["m"], 1000)
    for a, b in zip(need_full, need_q8):
        assert a.kv_bytes > 3 * b.kv_bytes  # float32 KV (the card gives no dtype): 256 vs 72 bytes a vector
        assert a.activation_bytes == b.activation_bytes
    # memory between the two needs: the full-precision instance refuses, the q8 one admits
    card_m = full_state.model_cards["m"]
    tokens = 8192
    full_need = min(n.need_bytes for n in rank_needs(full_state, full, card_m, tokens, 16))  # the instance's chunk
    q8_need = max(n.need_bytes for n in rank_needs(q_state, q8, card_m, tokens, 16))
    assert q8_need < full_need
    middle = (full_need + q8_need) // 2
    for state, instance, refused in ((full_state, full, True), (q_state, q8, False)):
        nodes = {k: msgspec.structs.replace(v, memory_available=middle, memory_total=middle + 4 * GIB)
                 for k, v in state.nodes.items()}
        squeezed = msgspec.structs.replace(state, nodes=nodes)
        assert (memory_refusal(squeezed, instance, card_m, tokens) is not None) is refused
