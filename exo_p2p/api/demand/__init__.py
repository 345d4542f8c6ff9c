"""Placement on demand (docs/models.md "Placement on demand and idle unload"): ``placer``."""
