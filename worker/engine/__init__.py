"""The MLX engine a runner drives, all synchronous (no trio inside); its parts and how they
fit: docs/architecture.md#engine.

- ``builder``: ``build_engine(loaded, settings, ring=)`` → ``Engine`` (built once per runner)
- ``scheduler``: ``Engine`` (``submit`` / ``cancel`` / ``step`` / ``has_work``); its parts
  ``task_queue``, ``prepare``, ``sequence``, ``batch``, ``prompt_cache``, ``batch_memory``
- ``loading.loader``: ``load_model(model_dir, start_layer=, end_layer=)`` → ``LoadProgress`` … ``LoadedModel``
- ``forward``, ``pipeline``, ``tensor``: stages, one rank's part of each step; the KV cache
- ``sampling``: per-request seeded sampler; ``answer.stop``: the stop-string matcher
- ``agreement``, ``distributed``: the ranks' task agreement and their MLX ring
- ``loading.dequantize``: float32 weights expanded at load for a CPU runner, float32 all-reduces
  between tensor ranks holding different weights
- ``answer``: what a row's decoded text becomes (``parser``, ``stop``, ``constraint``, ``tools``)
"""
