"""The API families a node serves, each a small module with one job: turn its requests into
our ``GenerationParams`` (a ``GenerationJob``) and our chunks into its bytes (a
``StreamEncoder``); the shared path (admission, task, chunks, cancel on disconnect,
keep-alives) is ``exo_p2p.api.generation.path``.

- ``openai_chat``: ``POST /v1/chat/completions``
- ``openai_completions``: ``POST /v1/completions``
- ``openai_responses``: ``POST /v1/responses`` (stateless)
- ``anthropic``: ``POST /v1/messages``, ``POST /v1/messages/count_tokens``
- ``ollama``: ``/api/chat``, ``/api/generate``, ``/api/tags``, ``/api/ps``, ``/api/show``,
  ``/api/version``, ``HEAD /`` and ``GET /``
- ``common``: the rules every family shares (sampling ranges, refusals by name).
"""
