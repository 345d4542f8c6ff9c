"""Write docs/configuration.md from the table of node settings (``exo_p2p.settings.table``).

    .venv/bin/python scripts/gen_config_docs.py           # rewrite the page
    .venv/bin/python scripts/gen_config_docs.py --check   # exit 1 when the page differs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exo_p2p.settings.docs import render_configuration  # noqa: E402

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the page differs")
    args = parser.parse_args()
    text = render_configuration()
    if args.check:
        same = PAGE.is_file() and PAGE.read_text() == text
        print(f"{PAGE.name} is {'up to date' if same else 'out of date: run scripts/gen_config_docs.py'}")
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
