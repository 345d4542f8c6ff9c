"""Images in the conversation: the pure rules over an image a client sends (decode, bounds,
digest) and the bounded fetch of an image URL (docs/api.md "Images", docs/security.md)."""
