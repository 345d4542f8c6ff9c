"""Model cards derived from a model's files (docs/architecture.md#vocabulary)."""
