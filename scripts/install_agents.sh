#!/usr/bin/env bash
# Installs the coding agents' own CLIs that the e2e tier runs against a node
# (tests/test_agent_clis.py, docs/agents.md), at pinned versions, into ./.agents (gitignored):
#
#   .agents/npm/node_modules/.bin/{claude,codex,opencode}   @anthropic-ai/claude-code, @openai/codex, opencode-ai
#   .agents/aider/bin/aider                                  aider-chat, in a venv of its own (its exact pins
#                                                            never touch .venv)
#
# Idempotent: a CLI already at its pinned version is left as it is. Nothing global is touched:
# no `npm -g`, npm's cache is .agents/npm-cache (removed after the install), the user's ~/.npmrc
# is not read, nothing is written to $HOME but pip's usual download cache. Needs node and npm (Debian: apt-get install nodejs npm) and python3 >= 3.10.
# Claude Code's package asks for Node >= 22, but what runs is its native binary (no Node at run
# time), so an older Node only makes npm warn.
#
#   bash scripts/install_agents.sh           install (or check) all four
#   bash scripts/install_agents.sh --check   exit 0 when all four are installed at their pins, 1 otherwise
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
NPM_PINS=(
  "@anthropic-ai/claude-code@2.1.332"
  "@openai/codex@0.171.0"
  "opencode-ai@1.18.33"
)
AIDER_PIN="aider-chat==0.86.2"
DIR=.agents
say() { echo "install_agents.sh: $*" >&2; }

npm_installed() {  # npm_installed NAME@VERSION: that exact version is in .agents/npm
  local spec=$1 name version
  name=${spec%@*} version=${spec##*@}
  [ -f "$DIR/npm/node_modules/$name/package.json" ] || return 1
  [ "$(node -p "require('./$DIR/npm/node_modules/$name/package.json').version" 2>/dev/null)" = "$version" ]
}

aider_installed() {
  [ -x "$DIR/aider/bin/aider" ] || return 1
  "$DIR/aider/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("aider-chat") != sys.argv[1])' \
    "${AIDER_PIN#*==}" 2>/dev/null
}

all_installed() {
  local spec
  for spec in "${NPM_PINS[@]}"; do npm_installed "$spec" || return 1; done
  aider_installed
}

install_npm() {
  local missing=() spec
  for spec in "${NPM_PINS[@]}"; do npm_installed "$spec" || missing+=("$spec"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  if ! command -v npm >/dev/null 2>&1; then
    say "npm not found: install Node.js and npm (Debian: apt-get install nodejs npm); skipping ${missing[*]}"
    return 1
  fi
  mkdir -p "$DIR/npm"
  [ -f "$DIR/npm/package.json" ] || echo '{"name": "exo-p2p-agents", "private": true}' > "$DIR/npm/package.json"
  say "installing ${missing[*]} into $DIR/npm"
  # The user's ~/.npmrc is not read (an empty one of our own instead; the machine's global
  # npmrc, e.g. a registry mirror, still applies); audits, funding and update-notifier off.
  : > "$DIR/npmrc"
  NPM_CONFIG_USERCONFIG="$DIR/npmrc" NPM_CONFIG_UPDATE_NOTIFIER=false \
    npm install --prefix "$DIR/npm" --cache "$DIR/npm-cache" --save-exact --no-audit --no-fund \
    --loglevel=error "${missing[@]}" >/dev/null
  rm -rf "$DIR/npm-cache"  # ~450 MB of tarballs nothing reads again (a pin change downloads anew)
}

install_aider() {
  aider_installed && return 0
  if [ ! -x "$DIR/aider/bin/python" ]; then
    say "creating $DIR/aider (a venv of its own for aider) with $("$PY" --version 2>&1)"
    "$PY" -m venv "$DIR/aider"
  fi
  say "installing $AIDER_PIN into $DIR/aider (a few minutes on a fresh machine)"
  # aider pins exact versions of its dependencies: a machine-wide pip constraints file would
  # fight them, so none is applied here (this venv is aider's alone).
  PIP_CONSTRAINT="" PIP_USER=0 "$DIR/aider/bin/python" -m pip install -q --disable-pip-version-check "$AIDER_PIN"
}

case "${1:-}" in
  --check) all_installed; exit $? ;;
  "") ;;
  *) echo "usage: bash scripts/install_agents.sh [--check]" >&2; exit 2 ;;
esac
started=$SECONDS
status=0
install_npm || status=1
install_aider || status=1
if all_installed; then
  say "agent CLIs ready in $DIR ($((SECONDS - started)) s)"
else
  say "some agent CLIs are not installed; their e2e tests skip (docs/testing.md)"
fi
exit $status
