"""What placement and the API need to know about a model (design.md §3 "model card")."""

from __future__ import annotations

import msgspec

from exo_p2p.types.common import Bytes, ModelId


class ModelCard(msgspec.Struct, frozen=True):
    """A model's shape and sizes, derived from its files (never from a hard-coded list).

    ``layer_bytes[i]`` is the storage size of transformer layer ``i`` in bytes;
    ``embedding_bytes`` the token embedding (loaded by rank 0), ``head_bytes`` the output head
    (0 when ``tie_word_embeddings``: the last rank then loads the embedding again, design.md
    §5), ``norm_bytes`` the final norm (last rank). ``storage_size`` is the sum of every
    tensor's bytes on disk, so ``storage_size = sum(layer_bytes) + embedding_bytes +
    head_bytes + norm_bytes``. ``context_length`` is in tokens.

    ``head_dim`` (elements per attention head; None = ``hidden_size // num_attention_heads``,
    the llama default) and ``activation_dtype_bytes`` (bytes per element of activations and
    KV cache; None = unknown, estimates then assume 4, float32) feed the per-token KV-cache
    estimate of ``master.admission``; optional, so cards from before them still decode.
    ``intermediate_size`` (MLP width) and ``quant_group_size`` (elements per quantization
    group of the layers' linears; None = not quantized) let placement refuse a tensor split
    the runner could not load (``master.placement_split.tensor_divisibility_problem``).
    """

    model_id: ModelId
    n_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    context_length: int
    storage_size: Bytes
    layer_bytes: tuple[int, ...]
    embedding_bytes: Bytes
    head_bytes: Bytes
    norm_bytes: Bytes
    tie_word_embeddings: bool
    architecture: str = "llama"
    supports_tensor: bool = True
    head_dim: int | None = None
    activation_dtype_bytes: int | None = None
    intermediate_size: int | None = None
    quant_group_size: int | None = None

    @property
    def non_layer_bytes(self) -> int:
        """Bytes of every tensor outside the transformer layers."""
        return self.embedding_bytes + self.head_bytes + self.norm_bytes

    def first_rank_extra_bytes(self) -> int:
        """Non-layer bytes rank 0 of a pipeline loads: the token embedding."""
        return self.embedding_bytes

    def last_rank_extra_bytes(self) -> int:
        """Non-layer bytes the last pipeline rank loads: final norm plus the output head, which
        is the embedding again when the embeddings are tied."""
        head = self.embedding_bytes if self.tie_word_embeddings else self.head_bytes
        return self.norm_bytes + head
