"""The runner's vision-language work: a vision tower's features per image, cached by the image
digest, spliced into the language model's input embeddings (docs/models.md#vision-models).
Imports mlx-vlm (the ``vision`` extra) only here, never on a text runner's path."""
