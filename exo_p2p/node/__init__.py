"""The node: its composition root (``node``), the parts it builds and hands to each other
(docs/architecture.md#layers). Imports nothing itself, so a part can be imported alone."""
