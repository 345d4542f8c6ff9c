"""The ``exo-p2p`` console script: the typer ``app`` with every command registered on it.

Exit codes: 0 success, 1 a failure the node reported or an unreachable node (one line
``error: ...`` on stderr), 2 bad arguments, 130 Ctrl-C. Never a traceback.
``--api URL`` and ``--api-key KEY`` are accepted before or after the subcommand;
``$EXO_P2P_API`` and ``$EXO_P2P_API_KEY`` otherwise. The shared options and the ``app``
itself are in ``exo_p2p.cli.common``; each group of commands registers on it when its module
is imported, and ``--help`` lists them in that order: ``cluster_cmds`` (``node``,
``cluster-secret``, ``invite``), ``listing_cmds`` (``nodes``, ``models``, ``instances``,
``previews``), ``placement_cmds`` (``place``, ``delete``, ``stop``), the aliases ``ps`` and
``ls`` below, ``doctor_cmd``, ``chat_cmds`` (``chat``, ``run``), ``top_cmd``,
``transfer_cmds`` (``pull``, ``rm``) and ``observe_cmds`` (``logs``).
Nothing imported here loads py-libp2p, MLX or the node: the commands that need them import
them when they run (``tests/test_cli_imports.py``).
"""

from __future__ import annotations

import os
import sys

from exo_p2p.cli.common import app
from exo_p2p.cli.cluster import commands as cluster_cmds  # noqa: F401,I001  (register, in help order)
from exo_p2p.cli.queries import listing as listing_cmds  # noqa: F401,I001  (register, in help order)
from exo_p2p.cli.placement import commands as placement_cmds  # noqa: F401,I001  (register, in help order)

# the habits of ollama/docker users: `ps` and `ls` (never `rm`, which deletes files in ollama)
app.command("ps", help="Same as `instances`.")(listing_cmds.instances)
app.command("ls", help="Same as `models`.")(listing_cmds.models)

from exo_p2p.cli.queries import doctor as doctor_cmd  # noqa: E402,F401,I001  (register, in help order)
from exo_p2p.cli.chat import commands as chat_cmds  # noqa: E402,F401,I001  (register, in help order)
from exo_p2p.cli.chat import embed as embed_cmd  # noqa: E402,F401,I001  (register, in help order)
from exo_p2p.cli.chat import image as image_cmd  # noqa: E402,F401,I001  (register, in help order)
from exo_p2p.cli.queries import requests_log as observe_cmds  # noqa: E402,F401,I001  (register, in help order)
from exo_p2p.cli.queries import top as top_cmd  # noqa: E402,F401,I001  (register, in help order)
from exo_p2p.cli.placement import transfer as transfer_cmds  # noqa: E402,F401,I001  (register, in help order)
from exo_p2p.cli.common import reflow_help  # noqa: E402

reflow_help(app)


def main() -> None:
    """The console script ``exo-p2p`` (and ``python -m exo_p2p``).

    ``exo-p2p node`` leaves with ``os._exit`` once it has stopped everything (runners reaped,
    logs flushed): the C++ static destructors of the libraries it loaded sometimes aborted a
    cleanly stopped node ("terminate called without an active exception", exit -6, after
    SIGTERM in 4 of 8 tries of an adversarial test)."""
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        code = 0
        try:
            app(prog_name="exo-p2p")  # standalone: prints errors, always raises SystemExit
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    app(prog_name="exo-p2p")
