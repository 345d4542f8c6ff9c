"""The quantized batch KV cache (``worker.engine.kvq``): every operation the decode batch, the
prefill groups, the prompt cache and speculation use — merge, update, right padding rolled
left, extend, filter, trim, extract — leaves each row's positions exactly where mlx-lm's
``BatchKVCache`` leaves them, holding the quantization of the same vectors; attention over it
is mlx-lm's quantized path; its bytes are those ``exo_p2p.models.kv_bytes`` counts."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache

from exo_p2p.models.kv_bytes import group_size, token_bytes, vector_bytes
from worker.engine.kvq.batch_cache import QuantizedBatchKVCache
from worker.engine.kvq.layers import from_arrays, layer_arrays, merge_rows, prefix_copy, quantized
from worker.engine.spec.rollback import rollback, rollback_supported

pytestmark = pytest.mark.unit
H, D = 2, 64


def vectors(rows: int, n: int, seed: int) -> tuple[mx.array, mx.array]:
    mx.random.seed(seed)
    return mx.random.normal((rows, H, n, D)), mx.random.normal((rows, H, n, D))


def pair(lengths: list[int], bits: int, seed: int = 0) -> tuple[BatchKVCache, QuantizedBatchKVCache]:
    """The same rows (``lengths`` positions each) in a full-precision and a quantized batch cache."""
    fp, q = [], []
    for i, n in enumerate(lengths):
        k, v = vectors(1, n, seed + i)
        f = KVCache()
        f.update_and_fetch(k, v)
        fp.append(f)
        c = quantized([KVCache()], bits, D)[0]
        c.update_and_fetch(k, v)
        q.append(c)
    return merge_rows(fp), merge_rows(q)


def same(fp: BatchKVCache, q: QuantizedBatchKVCache) -> None:
    """Every row's unpadded positions in ``q`` are the quantization of ``fp``'s, and the
    padding, offsets and write index agree."""
    assert q._idx == fp._idx
    assert q.left_padding.tolist() == fp.left_padding.tolist()
    assert q.offset.tolist() == fp.offset.tolist()
    keys, values = fp.keys_and_values()
    qk, qv = q.keys_and_values()
    for pad, row in zip(fp.left_padding.tolist(), range(keys.shape[0])):
        for full, triple in ((keys, qk), (values, qv)):
            want = mx.quantize(full[row, :, pad:], group_size=q.group_size, bits=q.bits)
            for a, b in zip(want, triple):
                assert mx.array_equal(a, b[row, :, pad:]).item()


@pytest.mark.parametrize("bits", [8, 4])
def test_every_row_operation_matches_the_full_precision_batch_cache(bits: int) -> None:
    fp, q = pair([5, 9, 1], bits)
    same(fp, q)
    k, v = vectors(3, 4, 7)  # a prefill chunk, right-padded then rolled left
    for c in (fp, q):
        c.prepare(right_padding=[0, 2, 3])
        c.update_and_fetch(k, v)
        c.finalize()
    same(fp, q)
    fp2, q2 = pair([300, 2], bits, seed=20)  # longer than one step: buffers of other sizes
    fp.extend(fp2)
    q.extend(q2)
    same(fp, q)
    index = mx.array([3, 0, 2], dtype=mx.int32)
    fp.filter(index)
    q.filter(index)
    same(fp, q)
    k, v = vectors(3, 1, 9)
    fp.update_and_fetch(k, v)
    q.update_and_fetch(k, v)
    fp.trim(1)
    q.trim(1)
    same(fp, q)
    for row in range(3):
        f, c = fp.extract(row), q.extract(row)
        assert c.offset == f.offset and c.bits == bits
        for a, b in zip(mx.quantize(f.keys, group_size=c.group_size, bits=bits), c.keys):
            assert mx.array_equal(a, b).item()


def test_rollback_drops_each_rows_own_count_as_in_full_precision() -> None:
    fp, q = pair([4, 6], 8)
    k, v = vectors(2, 5, 3)
    fp.update_and_fetch(k, v)
    q.update_and_fetch(k, v)
    assert rollback_supported([q]) and rollback_supported([fp])
    rollback([fp], [2, 4])
    rollback([q], [2, 4])
    same(fp, q)


def test_attention_takes_the_quantized_path_and_stays_close() -> None:
    from mlx_lm.models.base import scaled_dot_product_attention

    fp, q = pair([7, 3], 8)
    queries = mx.random.normal((2, 4, 1, D))
    k, v = vectors(2, 1, 5)
    masks = fp.make_mask(1, return_array=True), q.make_mask(1)  # made before the update, as a model does
    want = scaled_dot_product_attention(queries, *fp.update_and_fetch(k, v), fp, scale=D**-0.5, mask=masks[0])
    got = scaled_dot_product_attention(queries, *q.update_and_fetch(k, v), q, scale=D**-0.5, mask=masks[1])
    assert got.shape == want.shape
    assert mx.abs(got - want).max().item() < 0.05


def test_a_batch_of_mixed_quantizations_is_refused() -> None:
    _, q8 = pair([3], 8)
    _, q4 = pair([3], 4)
    with pytest.raises(ValueError, match="4-bit"):
        q8.extend(q4)
    with pytest.raises(ValueError, match="different quantizations"):
        QuantizedBatchKVCache.merge([q8.extract(0), q4.extract(0)])


def test_prompt_cache_arrays_round_trip_and_copies_leave_the_entry() -> None:
    _, q = pair([6], 8)
    layer = q.extract(0)
    arrays = layer_arrays(layer)
    assert len(arrays) == 6
    back = from_arrays(arrays, 6, 8)[0]
    assert back.bits == 8 and back.group_size == 64 and back.offset == 6
    copy = prefix_copy(layer, 4)
    assert copy.offset == 4 and layer.offset == 6 and copy.keys[0].shape[2] == 4
    with pytest.raises(ValueError, match="whole layers"):
        from_arrays(arrays[:4], 6, 8)


def test_bytes_held_are_the_counted_bytes() -> None:
    for bits in (8, 4):
        _, q = pair([256], bits)
        assert q.nbytes == 256 * token_bytes(H, D, 4, bits)  # float32 scales and biases here
    assert vector_bytes(64, 2, 8) == 68 and vector_bytes(64, 2, 0) == 128  # float16 KV: 1.88x
    assert vector_bytes(64, 4, 8) == 72 and vector_bytes(64, 4, 4) == 40  # float32 KV: 3.6x, 6.4x
    assert group_size(96) == 32
    with pytest.raises(ValueError, match="multiple of 32"):
        group_size(16)
    with pytest.raises(ValueError, match="bits"):
        vector_bytes(64, 2, 3)
