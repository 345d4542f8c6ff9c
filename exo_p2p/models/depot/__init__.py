"""A node's side of models travelling between nodes: what it holds and serves, shards, pulls (docs/models.md)."""
