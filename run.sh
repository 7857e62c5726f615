#!/usr/bin/env bash
# One entry point for every role and chore; configured only by environment
# variables (see env.example).
#   ./run.sh setup   create .venv and install the project with its test extra (idempotent)
#   ./run.sh test    setup, then the whole test suite
#   ./run.sh demo    setup, build demo data and stand-ins if missing, answer the eight queries
#   ./run.sh local   start the three nodes on 127.0.0.1 (logs under logs/local/)
#   NODE_NUMBER=N ./run.sh   start node N's role
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$(pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
DEMO_DIR="${DEMO_DIR:-$ROOT/data/demo}"

log() { echo "[run.sh] $*" >&2; }

setup() {
  local stamp="$VENV/.installed" want
  want="$(cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)"
  if [[ -x "$PY" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0  # already installed from these very files: nothing to do
  fi
  [[ -x "$PY" ]] || { log "creating $VENV"; python3 -m venv "$VENV"; }
  # torch first and pinned: an unpinned resolve would pull GBs of CUDA wheels.
  log "installing torch==2.13.0 and the project (editable, with the test extra)"
  "$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
  "$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]"
  echo "$want" > "$stamp"
}

setup_test_tools() {
  # Tools some tests drive as real processes (Debian's prometheus + promtool); the script
  # installs them where it can (root with apt) and otherwise says which tests will skip.
  [[ -x deploy/install-test-tools.sh ]] && deploy/install-test-tools.sh || true
}

demo_env() {
  export FAISS_INDEX_PATH="${FAISS_INDEX_PATH:-$DEMO_DIR/faiss_index.bin}"
  export DOCUMENTS_DIR="${DOCUMENTS_DIR:-$DEMO_DIR/documents}"
}

build_demo_data() {
  demo_env
  # Only the demo's own data is built here; a deployer's FAISS_INDEX_PATH is theirs.
  [[ "$FAISS_INDEX_PATH" == "$DEMO_DIR/faiss_index.bin" ]] || return 0
  if [[ ! -f "$FAISS_INDEX_PATH" || ! -f "$DOCUMENTS_DIR/documents.db" ]]; then
    log "building the demo data (support corpus) in $DEMO_DIR"
    "$PY" -m builders.data build --out "$DEMO_DIR" --kind support --docs "${DEMO_DOCS:-2000}" --force
  fi
}

cmd="${1:-}"
case "$cmd" in
  setup) setup ;;
  test)
    setup
    setup_test_tools
    export HF_HUB_OFFLINE=1 MODEL_SOURCE=standin STANDIN_PROFILE=tiny
    shift
    exec "$PY" -m pytest "$@"
    ;;
  demo)
    setup
    build_demo_data
    exec "$PY" -m services.demo
    ;;
  local)
    setup
    build_demo_data
    exec "$PY" -m services.local_cluster
    ;;
  "")
    if [[ -z "${NODE_NUMBER:-}" ]]; then
      echo "usage: ./run.sh {setup|test|demo|local}, or set NODE_NUMBER to start a node" >&2
      exit 2
    fi
    setup
    exec "$PY" -m services.node
    ;;
  *)
    echo "unknown subcommand '$cmd': expected setup, test, demo or local (or none with NODE_NUMBER set)" >&2
    exit 2
    ;;
esac
