"""The ``exo-p2p`` command line: ``node`` starts a node; every other command is a client of
a node's HTTP API (docs/architecture.md#layers: the API is the one door for the CLI and OpenAI clients).

Modules: ``client`` (HTTP calls, one method per endpoint), ``endpoint`` (which API URL and key
a command uses), ``errors`` (``CliError`` and the one-line messages of failed calls),
``chat_stream`` (a streamed chat answer decoded), ``render`` (tables), ``json_shapes``
(``--json`` shapes), ``readable`` (sizes, times and ids as people read them), ``waiting``
(wait for an instance to be ready, with progress), ``chat`` (streamed answers and the
interactive loop), ``local_node`` (a node started for the duration of ``run``), ``node_cmd``
(flag values → ``NodeConfig``), ``node_flags`` (the ``node`` command's options, generated from
``exo_p2p.settings``, and config.toml),
``secret`` (cluster secrets), ``membership`` and ``invite_cmd`` (join tokens, the secret kept
in the data dir), ``common`` (the typer app, the shared options, errors as one line),
``messages`` (the API-key error, node ids → names, the figures after an answer); the commands:
``cluster_cmds`` (``node``, ``cluster-secret``, ``invite``), ``listing_cmds`` (``nodes``,
``models``, ``instances``, ``previews``), ``placement_cmds`` (``place``, ``delete``,
``stop``), ``doctor_cmd``, ``chat_cmds`` (``chat``, ``run``), ``top_cmd``, ``transfer_cmds``
(``pull``, ``rm``), ``observe_cmds`` (``logs``); ``main`` (the app with every command
registered, in help order; the console script).
"""
