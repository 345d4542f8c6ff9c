"""Import of a GGUF file into an MLX-format model directory (docs/architecture.md#wire-and-storage)."""
