"""Where a node finds the models it holds (docs/models.md#model-stores)."""
