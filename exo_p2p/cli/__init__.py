"""The ``exo-p2p`` command line: ``node`` starts a node; every other command is a client of
a node's HTTP API (docs/architecture.md#layers: the API is the one door for the CLI and OpenAI clients).

``main`` is the console script (the typer app with every command registered, in help order);
``common`` what every command shares (the app, the shared options, errors as one line, the
client a command talks through); ``errors`` (``CliError`` and the one-line messages of failed
calls); ``messages`` (the API-key error, node ids -> names, the figures after an answer).
The sub-packages, by job: ``node_api`` (talking to a node's API), ``cluster`` (``node``,
``cluster-secret``, ``invite``), ``placement`` (``place``, ``delete``, ``stop``, ``pull``, ``rm``),
``chat`` (``chat``, ``run``, ``embed``), ``queries`` (``nodes``, ``models``, ``instances``,
``previews``, ``logs``, ``top``, ``doctor``) and ``output`` (tables and ``--json`` shapes).
"""
