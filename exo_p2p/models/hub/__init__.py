"""A Hugging Face model hub as a source of models (docs/models.md#models-from-a-hub)."""
