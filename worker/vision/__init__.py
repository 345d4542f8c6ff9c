"""The runner's vision-language work: a vision tower's features per image, cached by the image
digest, spliced into the language model's input embeddings (docs/models.md#vision-models).
The runner's side: the builder and engine of a vision model (``builder``, ``engine``, ``rows``),
the images sent to it (``delivery`` on the node, ``inbox`` in the runner). Imports mlx-vlm
(the ``vision`` extra) only in a vision runner, never on a text runner's path."""
