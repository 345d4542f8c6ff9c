"""The engine's settings as one record, from the node's flags to the runner's engine.

``EngineSettings`` is built once from ``NodeConfig`` (the ``node`` command's
``--prefill-chunk-size``, ``--max-batch``, ``--prompt-cache-bytes``, ``--kv-cache-bytes``),
handed to the worker, narrowed per runner (``for_runner``: the instance's ``RankSettings``
replace this node's, the node's KV budget is resolved to bytes) and sent in
``RunnerSetup``; the runner's builder (``worker.engine.builder``) reads it. A new engine
setting is a field here, its flag, and the part of the engine that uses it.
"""

from __future__ import annotations

import msgspec

from exo_p2p.defaults import MAX_BATCH, PREFILL_CHUNK_SIZE, PROMPT_CACHE_BYTES
from exo_p2p.types.instances import RankSettings


SPECULATIVE = ("off", "ngram")
"""The kinds of speculative decoding (``--speculative``; draft-model drafting is not built)."""


class EngineSettings(msgspec.Struct, frozen=True):
    """What a runner's engine is built with.

    ``prefill_chunk_size``: prompt tokens per prefill step (tokens, ≥ 1). ``max_batch``:
    sequences decoded together in one forward pass (≥ 1). These two are rank settings: every
    rank of an instance must use the same (``RankSettings``; ranks prefilling in chunks of
    other sizes meet at other collective points). ``prompt_cache_bytes``: bytes of finished
    sequences' KV kept for reuse (≥ 0; 0: no prompt cache). ``kv_cache_bytes``: bytes of KV
    cache the runner's batch and prompt cache may hold (None on a node: "what its memory
    leaves beside its placed shards", resolved by the worker; None in a ``RunnerSetup``: no
    memory check). ``micro_batches``: micro-batches a pipeline rank splits its decode batch into
    (0: the engine's rule, ``worker.engine.micro.auto_micro_batches``; 1: none; the ranks of an
    instance agree the smallest). ``prompt_cache_disk_bytes``: bytes of finished sequences' KV
    each rank keeps on disk (≥ 0; 0: no disk tier; ``worker.engine.cache.disk_tier``) under
    ``prompt_cache_dir`` ("" : no disk tier; the worker sets ``<data dir>/prompt-cache``).
    ``speculative``: ``off`` or ``ngram`` (prompt-lookup drafting, ``worker/engine/spec/``);
    ``num_draft``: the most tokens a row drafts per step (1 … 16). ``kv_cache_bits``: 0 (full
    precision), 8 or 4: the batch's, the prompt cache's and the disk tier's KV quantized
    (``worker/engine/kvq``; a rank setting, like ``max_batch``).
    Raises ``ValueError`` from ``check`` for a value out of range.
    """

    prefill_chunk_size: int = PREFILL_CHUNK_SIZE
    max_batch: int = MAX_BATCH
    prompt_cache_bytes: int = PROMPT_CACHE_BYTES
    kv_cache_bytes: int | None = None
    micro_batches: int = 0
    prompt_cache_disk_bytes: int = 0
    prompt_cache_dir: str = ""
    speculative: str = "off"
    num_draft: int = 8
    kv_cache_bits: int = 0

    def check(self) -> EngineSettings:
        """``self``, or ``ValueError`` naming the first setting out of range."""
        if self.prefill_chunk_size < 1:
            raise ValueError(f"prefill_chunk_size must be >= 1, not {self.prefill_chunk_size}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, not {self.max_batch}")
        if self.prompt_cache_bytes < 0:
            raise ValueError(f"prompt_cache_bytes must be >= 0, not {self.prompt_cache_bytes}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 0:
            raise ValueError(f"kv_cache_bytes must be >= 0, not {self.kv_cache_bytes}")
        if self.prompt_cache_disk_bytes < 0:
            raise ValueError(f"prompt_cache_disk_bytes must be >= 0, not {self.prompt_cache_disk_bytes}")
        if self.micro_batches < 0:
            raise ValueError(f"micro_batches must be >= 0, not {self.micro_batches}")
        if self.speculative not in SPECULATIVE:
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE)}, not {self.speculative!r}")
        if not 1 <= self.num_draft <= 16:
            raise ValueError(f"num_draft must be in 1..16, not {self.num_draft}")
        if self.kv_cache_bits not in (0, 4, 8):
            raise ValueError(f"kv_cache_bits must be 0, 4 or 8, not {self.kv_cache_bits}")
        return self

    def in_data_dir(self, data_dir: object) -> EngineSettings:
        """These settings with the prompt cache's disk tier under ``<data_dir>/prompt-cache``
        unless a directory is set already (docs/architecture.md "Prompt cache disk tier")."""
        if self.prompt_cache_dir:
            return self
        return msgspec.structs.replace(self, prompt_cache_dir=f"{data_dir}/prompt-cache")

    def rank_settings(self) -> RankSettings:
        """The settings a master fixes in the instances it places (every rank the same)."""
        return RankSettings(prefill_chunk_size=self.prefill_chunk_size, max_batch=self.max_batch,
                            kv_cache_bits=self.kv_cache_bits)

    def for_runner(self, instance_settings: RankSettings | None, kv_cache_bytes: int | None) -> EngineSettings:
        """This node's settings for a runner of an instance placed with ``instance_settings``
        (None: placed without; this node's own rank settings then) and a resolved KV budget
        (bytes; None: no memory check). The prompt cache gets at most a quarter of a known
        budget."""
        rank = instance_settings or self.rank_settings()
        cache = self.prompt_cache_bytes if kv_cache_bytes is None else min(self.prompt_cache_bytes, kv_cache_bytes // 4)
        return msgspec.structs.replace(self, prefill_chunk_size=rank.prefill_chunk_size, max_batch=rank.max_batch,
                                       kv_cache_bits=rank.kv_cache_bits, prompt_cache_bytes=cache,
                                       kv_cache_bytes=kv_cache_bytes)
