"""OpenAI's images API on the node (docs/images.md#api): ``POST /v1/images/generations``, the
generated files served by URL for a bounded time. ``request`` parses and bounds a body,
``run`` drives one image task on the cluster, ``encode`` makes the files and the answers,
``files`` keeps the ones served by URL, ``routes`` binds them."""
