"""Models and hubs the tests make: tiny random models of the mlx-lm families and their agent
layout, an encoder, GGUF files, model stores laid out on disk, repositories and the stand-in hub
(hostile repos too).
"""
