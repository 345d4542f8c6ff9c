"""The quantized KV cache (``--kv-cache-bits 8|4``; docs/architecture.md "Quantized KV cache").

``batch_cache``: ``QuantizedBatchKVCache``, the left-padded batch cache of the decode batch and
the prefill groups with its keys and values stored by ``mx.quantize`` (attention through
mlx-lm's quantized scaled-dot-product path); ``layers``: the per-sequence caches (mlx-lm's
``QuantizedKVCache``), merging rows of either kind, copies and the arrays the prompt cache and
its disk tier keep. The bytes a token of quantized KV takes (for the batch's capacity and
the master's admission) are ``exo_p2p.models.kv_bytes``'s.
"""
