"""A node's copies of models on disk, complete or partial (docs/models.md)."""
