"""The ``exo-p2p`` command line: ``node`` starts a node; every other command is a client of
a node's HTTP API (docs/architecture.md#layers: the API is the one door for the CLI and OpenAI clients).

Modules: ``client`` (HTTP calls and their errors), ``render`` (tables and ``--json``
shapes), ``waiting`` (wait for an instance to be ready, with progress), ``chat`` (streamed
answers and the interactive loop), ``local_node`` (a node started for the duration of
``run``), ``node_cmd`` (flags → ``NodeConfig``), ``secret`` (cluster secrets), ``membership`` and ``invite_cmd``
(join tokens, the secret kept in the data dir), ``common`` (the typer app, the
shared options, errors as one line), ``messages`` (the API-key error, node ids → names, the
figures after an answer), ``chat_cmds`` (``chat``, ``run``), ``main`` (the node and the
other commands; the console script).
"""
