"""The MLX engine a runner drives, all synchronous (no trio inside):

- ``loader``: ``load_model(model_dir, start_layer=, end_layer=)`` → ``LoadProgress`` … ``LoadedModel``
- ``generator``: ``Generator`` (``submit`` / ``cancel`` / ``step`` / ``has_work``), ``GenerationRequest``
- ``forward``: the model forward pass (the seam for pipeline stages) and the KV cache
- ``sampling``: per-request seeded sampler; ``stop``: the stop-string matcher
- ``dequantize``: float32 weights expanded at load for a CPU runner, float32 all-reduces
  between tensor ranks holding different weights
"""
