"""The prompt cache's tiers beyond RAM (docs/architecture.md "Prompt cache disk tier").

``block``: the self-checking block file of one entry; ``disk_tier``: a rank's directory of
blocks, LRU-bounded, written in the background; ``identity``: what a block must match to be
loaded (the model, the rank's layers) and where a rank's tier lives.
"""
