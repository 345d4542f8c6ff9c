"""Anthropic Messages: requests, answers and streams (``messages``), tools and thinking (``tools``)."""
