"""Speculative decoding (docs/architecture.md#speculative-decoding): model-free prompt-lookup
drafting (``ngram``), the per-row draft policy (``policy``), the per-row KV rollback
(``rollback``) and the verification step inside the decode batch (``verify``)."""
