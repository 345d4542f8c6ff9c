"""What placement and the API need to know about a model (docs/architecture.md#vocabulary "model card")."""

from __future__ import annotations

import msgspec

from exo_p2p.types.common import Bytes, ModelId


class ModelCard(msgspec.Struct, frozen=True):
    """A model's shape and sizes, derived from its files (never from a hard-coded list).

    ``layer_bytes[i]`` is the storage size of transformer layer ``i`` in bytes;
    ``embedding_bytes`` the token embedding (loaded by rank 0), ``head_bytes`` the output head
    (0 when ``tie_word_embeddings``: the last rank then loads the embedding again, docs/architecture.md#rules), ``norm_bytes`` the final norm (last rank). ``storage_size`` is the sum of every
    tensor's bytes on disk, so ``storage_size = sum(layer_bytes) + embedding_bytes +
    head_bytes + norm_bytes``. ``context_length`` is in tokens.

    ``head_dim`` (elements per attention head; None = ``hidden_size // num_attention_heads``,
    the llama default) and ``activation_dtype_bytes`` (bytes per element of activations and
    KV cache; None = unknown, estimates then assume 4, float32) feed the per-token KV-cache
    estimate of ``master.admission``; optional, so cards from before them still decode.
    ``intermediate_size`` (MLP width) and ``quant_group_size`` (elements per quantization
    group of the layers' linears; None = not quantized) let placement refuse a tensor split
    the runner could not load (``master.placement.split.tensor_divisibility_problem``).
    ``float32_*`` are the same parts' bytes once expanded to float32 at load (a CPU-only
    node's runner, ``--cpu-weights``); empty / 0 on cards from before them (never expanded).
    ``quantization``: how the weights are stored (``exo_p2p.models.card.families.quantization_of``:
    ``"4-bit, group 64"``, ``"bfloat16"``...; empty on cards from before it).
    ``capabilities``: what its chat template knows (``exo_p2p.models.card.capabilities``:
    ``completion``, ``tools``, ``thinking``; empty on cards from before it).
    ``tasks``: the kinds of work the model can do (``exo_p2p.types.kinds.model_tasks``:
    ``generate``, ``embed``, ``rerank``; empty on cards from before kinds: generation only,
    ``exo_p2p.types.kinds.card_tasks``). The parts an encoder lacks are optional: no output
    head (``head_bytes`` 0), no final norm outside its layers (``norm_bytes`` 0), nothing
    tied (``tie_word_embeddings`` False); its ``num_key_value_heads`` is its attention heads
    (no grouped KV), it has no chat template (``capabilities`` empty) and is not split
    (``supports_tensor`` False; the master keeps it on one node: ``master.task_kinds.split_refusal``).
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
    head_bytes: Bytes = 0
    norm_bytes: Bytes = 0
    tie_word_embeddings: bool = False
    architecture: str = "llama"
    supports_tensor: bool = True
    head_dim: int | None = None
    activation_dtype_bytes: int | None = None
    intermediate_size: int | None = None
    quant_group_size: int | None = None
    float32_layer_bytes: tuple[int, ...] = ()
    float32_embedding_bytes: Bytes = 0
    float32_head_bytes: Bytes = 0
    float32_norm_bytes: Bytes = 0
    quantization: str = ""
    capabilities: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    shared_bytes: Bytes = 0
    """Non-layer bytes every pipeline rank holds (an image transformer's embedders,
    modulations and output: ``worker.image.stages``); part of ``storage_size``."""
    work_bytes: Bytes = 0
    """Working memory rank 0 needs beyond its weights (an image model's VAE decode of its
    largest image: ``exo_p2p.images.card.decode_bytes``); not stored."""

    @property
    def expandable(self) -> bool:
        """The card knows the model's float32 sizes (a CPU node may then hold it in float32)."""
        return len(self.float32_layer_bytes) == self.n_layers and self.n_layers > 0

    def sized_for(self, weights_dtype: str) -> ModelCard:
        """This card with the sizes of the weights a runner holds: ``"stored"`` → itself;
        ``"float32"`` → the ``float32_*`` sizes in ``layer_bytes``, ``embedding_bytes``,
        ``head_bytes``, ``norm_bytes`` and ``storage_size`` (activations then 4 bytes;
        ``quant_group_size`` stays: a tensor rank shards the stored tensors before it expands
        them), so every share rule of ``master.placement.split`` applies unchanged. Raises
        ``ValueError`` for float32 on a card that is not ``expandable``, or another dtype."""
        if weights_dtype == "stored":
            return self
        if weights_dtype != "float32":
            raise ValueError(f"unknown weights dtype {weights_dtype!r}; use stored or float32")
        if not self.expandable:
            raise ValueError(f"model {self.model_id}'s card has no float32 sizes")
        return msgspec.structs.replace(
            self,
            layer_bytes=self.float32_layer_bytes,
            embedding_bytes=self.float32_embedding_bytes,
            head_bytes=self.float32_head_bytes,
            norm_bytes=self.float32_norm_bytes,
            storage_size=sum(self.float32_layer_bytes) + self.float32_embedding_bytes
            + self.float32_head_bytes + self.float32_norm_bytes,
            activation_dtype_bytes=4,
        )

    @property
    def non_layer_bytes(self) -> int:
        """Bytes of every tensor outside the transformer layers."""
        return self.embedding_bytes + self.head_bytes + self.norm_bytes + self.shared_bytes

    def first_rank_extra_bytes(self) -> int:
        """Non-layer bytes rank 0 of a pipeline loads: the token embedding."""
        return self.embedding_bytes

    def last_rank_extra_bytes(self) -> int:
        """Non-layer bytes the last pipeline rank loads: final norm plus the output head, which
        is the embedding again when the embeddings are tied."""
        head = self.embedding_bytes if self.tie_word_embeddings else self.head_bytes
        return self.norm_bytes + head


class HubSource(msgspec.Struct, frozen=True):
    """Where a model no node holds comes from: a Hugging Face repo (``repo_id``, ``ORG/NAME``)
    at the commit ``revision`` (40 hex digits: a moved branch never changes what the cluster
    fetches), whose files' manifest has ``digest`` (``ModelManifest.digest``, weight chunks
    without hashes until fetched: ``exo_p2p.models.hub.manifest``)."""

    repo_id: str
    revision: str
    digest: str
