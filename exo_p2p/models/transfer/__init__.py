"""Model chunks travelling between nodes: protocols, the bulk path, one fetch (docs/models.md)."""
