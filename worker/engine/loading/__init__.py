"""Loading a model's weights: ``loader`` (a model or one rank's share, with progress, through
mlx-lm) and ``dequantize`` (float32 weights for a CPU runner).
"""
