"""Image models on the node side (docs/images.md): their cards from their files (``card``),
the bounds of an image request (``bounds``)."""
