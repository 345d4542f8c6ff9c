"""Ollama's native API: generations (``generations``), request reading (``params``), model
endpoints (``models``), tools and thinking (``tools``)."""
