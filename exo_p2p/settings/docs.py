"""docs/configuration.md, rendered from the one table of node settings (``exo_p2p.settings.table``).

``render_configuration`` writes the page: the flags table (flag, type or unit, default,
environment variable, ``config.toml`` key, ``NodeConfig`` field, meaning), the environment
variables (the flags' own, then ``ENVIRONMENT``) and the ``config.toml`` format.
``scripts/gen_config_docs.py`` (``GENERATE_COMMAND``) writes it; tests/test_configuration_docs.py
checks that the page is what this renders.
"""

from __future__ import annotations

from exo_p2p.settings.setting import default_text
from exo_p2p.settings.table import ENVIRONMENT, SETTINGS

CONFIG_FILE = "config.toml"
"""The file of node settings in the data dir (``exo_p2p.cli.cluster.node_config.NODE_CONFIG_FILE``)."""
GENERATE_COMMAND = ".venv/bin/python scripts/gen_config_docs.py"
"""The command that writes docs/configuration.md."""


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell."""
    return text.replace("|", "\\|")


def _code(text: str | None) -> str:
    """``text`` as code in a table cell; an em dash for none."""
    return f"`{_cell(text)}`" if text else "—"


def _flags_table() -> list[str]:
    """The lines of the flags table, one row per setting in ``--help`` order."""
    lines = ["| flag | type or unit | default | environment variable | `config.toml` key | `NodeConfig` field | meaning |",
             "|---|---|---|---|---|---|---|"]
    for s in SETTINGS.values():
        flag = f"`{s.flag} {s.metavar}`" if s.metavar else f"`{s.flag}`"
        field = f"`{'not ' if s.inverted else ''}{s.field}`" if s.field else "—"
        meaning = ("(hidden) " if s.hidden else "") + s.help
        lines.append(f"| {_cell(flag)} | {_cell(s.kind_text)} | {_cell(default_text(s))} | {_code(s.env)} | "
                     f"{_code(s.key)} | {field} | {_cell(meaning)} |")
    return lines


def _env_table() -> list[str]:
    """The lines of the environment table: each flag's variable (with what ``ENVIRONMENT``
    adds about it), then the other variables."""
    extra = {e.name: e for e in ENVIRONMENT}
    lines = ["| variable | read by | meaning |", "|---|---|---|"]
    for s in SETTINGS.values():
        if s.env is None:
            continue
        also = extra.pop(s.env, None)
        meaning = f"`{s.flag}` of `exo-p2p node`" + (f"; {also.help}" if also else "")
        lines.append(f"| `{s.env}` | node{', ' + also.read_by if also else ''} | {_cell(meaning)} |")
    lines += [f"| `{e.name}` | {e.read_by} | {_cell(e.help)} |" for e in extra.values()]
    return lines


_INTRO = """\
Every setting of `exo-p2p node`: its flag, the environment variable and the `config.toml` key
that set it too, the `NodeConfig` field (`exo_p2p/config.py`) it fills (`engine.…`: a field
of its `EngineSettings` record, `exo_p2p/types/engine.py`), and its default. A
value given on the command line wins, then the environment, then `config.toml` in the data
dir, then the default. `exo-p2p node --help` shows the same text."""

_FILE = """\
`DATA_DIR/config.toml` (TOML; optional) sets any flag the command line and the environment
left unset. A key is the flag's name without `--` (`api-port`; `api_port` is read alike);
a repeatable flag takes a list (a single value counts as a list of one); a flag without a
value (`no-mdns`, `new-identity`) takes `true` or `false`. `data-dir` cannot be set in the
data dir's own file, and a key that names no flag, or a value the flag refuses, stops the
node with an error naming the file and the key. Example:

```toml
api-port = 52525
listen-port = 52524
name = "b"
models-dir = ["/srv/models"]
bootstrap = ["/ip4/10.0.0.2/tcp/52514/p2p/12D3KooW..."]
max-batch = 8
no-mdns = true
```"""


def render_configuration() -> str:
    """The text of docs/configuration.md."""
    parts = [
        "# Configuration", "",
        f"Generated from the table in `exo_p2p/settings/table.py` by `{GENERATE_COMMAND}`; do not",
        "edit it by hand: `tests/test_configuration_docs.py` fails when it differs from the code.", "",
        _INTRO, "",
        "Sizes are bytes unless a unit is given (`--memory-limit`: KiB/MiB/GiB are powers of 1024,",
        "KB/MB/GB of 1000). A repeatable flag is given once per value; its variable takes the values",
        "separated by spaces (directories: by colons, like `PATH`).", "",
        "## Flags", "", *_flags_table(), "",
        "## Environment variables", "", *_env_table(), "",
        f"## {CONFIG_FILE}", "", _FILE, "",
    ]
    return "\n".join(parts)
