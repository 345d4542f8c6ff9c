"""Embeddings and reranking, the pure parts (docs/api.md#embeddings-and-reranking).

``pooling``: how a model's hidden states become one vector (read from its files);
``vectors``: pooling, normalisation, Matryoshka truncation and base64 of vectors (numpy);
``requests``: the OpenAI, Ollama and rerank bodies parsed into one ``EmbedRequest``;
``bounds``: what one request may ask; ``answers``: each family's response body;
``rerank``: scores to ordered results. The runner's side is ``worker.embed``.
"""
