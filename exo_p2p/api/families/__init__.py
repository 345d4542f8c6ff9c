"""The API families a node serves, each a small module with one job: turn its requests into
our ``GenerationParams`` (a ``GenerationJob``) and our chunks into its bytes (a
``StreamEncoder``); the shared path (admission, task, chunks, cancel on disconnect,
keep-alives) is ``exo_p2p.api.generation.path``.

One package per vendor, each with its request reading, answer rendering and streaming:

- ``openai``: ``chat`` (``POST /v1/chat/completions``, tools and reasoning in ``chat_tools``),
  ``completions`` (``POST /v1/completions``), ``responses`` (``POST /v1/responses``, stateless;
  ``responses_tools``, ``responses_include``, ``sealed_reasoning``)
- ``anthropic``: ``messages`` (``POST /v1/messages``, ``POST /v1/messages/count_tokens``), ``tools``
- ``ollama``: ``generations`` (``/api/chat``, ``/api/generate``, ``HEAD /`` and ``GET /``),
  ``models`` (``/api/tags``, ``/api/ps``, ``/api/show``, ``/api/version``), ``params``, ``tools``

and what they share: ``common`` (sampling ranges, refusals by name, SSE framing) and
``tool_calls`` (function tools and tool calls: the checks and the shapes several families
have in common). Every family's routes are registered in ``exo_p2p.api.routes.api_routes``.
"""
