"""Chunk routing: where a task's chunks travel between nodes (``routes``), their delivery to
the API requests waiting for them (``router``) and their order checked end to end (``order``)."""
