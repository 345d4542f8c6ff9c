"""The ``exo-p2p`` command line: ``node`` starts a node; every other command is a client of
a node's HTTP API (docs/architecture.md#layers: the API is the one door for the CLI and OpenAI clients).

Modules: ``client`` (HTTP calls and their errors), ``render`` (tables and ``--json``
shapes), ``waiting`` (wait for an instance to be ready, with progress), ``chat`` (streamed
answers and the interactive loop), ``local_node`` (a node started for the duration of
``run``), ``node_cmd`` (flags → ``NodeConfig``), ``secret`` (cluster secrets), ``membership`` and ``invite_cmd``
(join tokens, the secret kept in the data dir), ``main``
(the typer app).
"""
