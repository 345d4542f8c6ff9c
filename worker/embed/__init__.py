"""The runner's embedding work: an ``Embedder`` over a model's final hidden states
(``embedder``), for decoders run by mlx-lm (``decoder``) and encoders run by
``mlx_embeddings`` (``encoder``); docs/api.md#embeddings-and-reranking.
"""
