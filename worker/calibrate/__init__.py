"""This node's speed: a short MLX calibration in a subprocess (``measure``), its parse,
bounds, quantisation and re-measure rule (``run``); docs/placement-speed.md."""
