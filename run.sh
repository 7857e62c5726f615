#!/usr/bin/env bash
# One entry point for every role and chore; configured only by environment
# variables (see env.example). `./run.sh help` lists the commands (usage() below).
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$(pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
DEMO_DIR="${DEMO_DIR:-$ROOT/data/demo}"
TORCH_VERSION=2.13.0  # the CPU kernels were verified on 2.12 and 2.13
TORCH_CUDA_VERSION=2.11.0  # the CUDA kernels on 2.11 only

log() { echo "[run.sh] $*" >&2; }

# The project's extras each path installs: a serving machine gets OpenTelemetry (TRACING=otlp|jsonl,
# as the image has it) and nothing of the tests; `./run.sh test` adds the test extra and, with
# setup_test_tools, the tools the tests drive (checkov, prometheus, python3-doc, Docker, chromium).
SERVING_EXTRAS=tracing
TEST_EXTRAS=test,tracing

setup() {
  install_venv "$SERVING_EXTRAS"
  build_kernels
}

setup_for_tests() {
  install_venv "$TEST_EXTRAS"
  build_kernels
  setup_test_tools
}

# The torch build this machine gets (TORCH_BUILD=auto|cpu|cuda; auto: cuda when `nvidia-smi -L` lists a
# GPU, else cpu). PyPI's Linux x86-64 torch is the CUDA build, gigabytes of CUDA libraries: a machine
# without a GPU takes the CPU build from PyTorch's CPU index (TORCH_CPU_INDEX_URL) instead.
torch_build() {
  case "${TORCH_BUILD:-auto}" in
    cpu|cuda) echo "$TORCH_BUILD" ;;
    auto) if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
            echo cuda
          else
            echo cpu
          fi ;;
    *) echo "TORCH_BUILD='$TORCH_BUILD' is not valid: expected auto, cpu or cuda" >&2; exit 2 ;;
  esac
}

# pip's arguments for that build of torch, at the version pipeline/kernels/versions.py accepts on it.
torch_pip_args() {
  local build="$1"
  if [[ "$build" == cuda ]]; then
    echo "torch==$TORCH_CUDA_VERSION"  # PyPI's Linux x86-64 build is the CUDA one
  elif [[ "$(uname -s)" == Linux ]]; then
    # PyPI's Linux wheels (x86-64 and aarch64 alike) are CUDA builds; the CPU index has +cpu ones of both.
    echo "torch==$TORCH_VERSION+cpu --extra-index-url ${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
  else
    echo "torch==$TORCH_VERSION"  # PyPI's macOS wheel is the CPU build
  fi
}

# What an installed venv was installed from: the project's requirement files and this machine's torch.
setup_stamp() {
  echo "$(cat setup.cfg pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)-$(torch_pip_args "$1" | sha256sum | cut -c1-12)"
}

# Is the venv installed from these very files with at least the extras $1 (comma-separated)? Its stamp is
# "<setup_stamp> <extras>": a test machine's venv (test,tracing) serves a node without reinstalling.
venv_current() {
  local stamp="$VENV/.installed" have extra
  [[ -x "$PY" && -f "$stamp" ]] || return 1
  read -r -a have < "$stamp"
  [[ "${have[0]:-}" == "$(setup_stamp "$(torch_build)")" ]] || return 1
  for extra in ${1//,/ }; do
    [[ ",${have[1]:-}," == *",$extra,"* ]] || return 1
  done
}

install_venv() {
  local extras="$1" build
  venv_current "$extras" && return 0  # already installed from these very files: nothing to do
  build="$(torch_build)"
  [[ -x "$PY" ]] || { log "creating $VENV"; python3 -m venv "$VENV"; }
  # torch first and pinned, its build chosen by the machine; then the project within constraints.txt.
  log "installing torch ($build build: $(torch_pip_args "$build")) and the project (editable, extras: $extras)"
  # torch alone from its index (--no-deps: its dependencies come from the default index below, with the rest).
  # shellcheck disable=SC2046 # the arguments are words
  "$PY" -m pip install --quiet --disable-pip-version-check --retries 1 --no-deps $(torch_pip_args "$build")
  "$PY" -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[$extras]"
  echo "$(setup_stamp "$build") $extras" > "$VENV/.installed"
}

# What `setup` (or, with `test`, the test path) installs on this machine, one line a step; runs nothing.
setup_plan() {
  local extras="$SERVING_EXTRAS" build
  [[ "${1:-}" == test ]] && extras="$TEST_EXTRAS"
  build="$(torch_build)"
  if venv_current "$extras"; then
    echo "venv     $VENV: installed from these files with extras [$extras]; nothing to install"
  else
    echo "venv     $VENV: pip install --no-deps $(torch_pip_args "$build")"
    echo "venv     $VENV: pip install -c constraints.txt -e .[$extras]"
  fi
  echo "kernel   pipeline/kernels/compiled.py's C++ kernels (VNNI int8 product, int8 glue, ordered attention), compiled with g++ once per source version (without g++: torch's ops)"
  if [[ "${1:-}" == test ]]; then
    echo "tools    deploy/install-test-tools.sh: checkov (its own venv), Debian's prometheus and python3-doc (root with apt)"
    echo "tools    deploy/install-container-tools.sh: Debian's docker.io (dockerd started) and debootstrap (root with apt)"
    echo "tools    deploy/install-browser.sh: Debian's chromium and chromium-driver (root with apt)"
  else
    echo "not      the test extra, checkov, prometheus, python3-doc, Docker, chromium: ./run.sh test installs them"
  fi
}

build_kernels() {
  # The C++ kernels (pipeline/kernels/compiled.py: int8-dynamic's one-call VNNI product and its fused
  # glue around fbgemm, the CPU's ordered attention), compiled once per source version into torch's
  # extension cache (20-40 s each; a later call finds them built without importing torch, in well under
  # a second). Without a C++ compiler torch's ops and fbgemm run instead: the int8 products give the
  # same results, the attention's (flash in chunks) other bits, all slower.
  "$PY" -m pipeline.kernels.compiled >/dev/null 2>&1 \
    || log "the C++ kernels could not be built (is g++ installed?): torch's ops run instead (attention: other bits, slower)"
}

setup_test_tools() {
  # Tools some tests drive as real processes (Debian's prometheus + promtool; a Docker daemon and
  # debootstrap for the container test; chromium for the chat page's); the scripts install them where they can (root with apt)
  # and otherwise say which tests will skip.
  [[ -x deploy/install-test-tools.sh ]] && deploy/install-test-tools.sh || true
  [[ -x deploy/install-container-tools.sh ]] && deploy/install-container-tools.sh || true
  [[ -x deploy/install-browser.sh ]] && deploy/install-browser.sh || true
}

demo_env() {
  export FAISS_INDEX_PATH="${FAISS_INDEX_PATH:-$DEMO_DIR/faiss_index.bin}"
  export DOCUMENTS_DIR="${DOCUMENTS_DIR:-$DEMO_DIR/documents}"
}

build_demo_data() {
  demo_env
  # Only the demo's own data is built here; a deployer's FAISS_INDEX_PATH is theirs.
  [[ "$FAISS_INDEX_PATH" == "$DEMO_DIR/faiss_index.bin" ]] || return 0
  # The shard count `./run.sh local` will serve (LOCAL_INDEX_SHARDS, else INDEX_SHARDS): its files.
  local shards="${LOCAL_INDEX_SHARDS:-${INDEX_SHARDS:-1}}" first="$FAISS_INDEX_PATH"
  [[ "$shards" == 1 ]] || first="${FAISS_INDEX_PATH%.bin}.shard-0-of-$shards.bin"
  # No manifest: built before data versions, or interrupted; nodes refuse it, so it is built again.
  if [[ ! -f "$first" || ! -f "$DOCUMENTS_DIR/documents.db" || ! -f "$DEMO_DIR/manifest.json" ]]; then
    log "building the demo data (support corpus, $shards index shard(s)) in $DEMO_DIR"
    "$PY" -m builders.data build --out "$DEMO_DIR" --kind support --docs "${DEMO_DOCS:-2000}" --shards "$shards" --force
  fi
}

usage() {
  cat <<'EOF'
usage: ./run.sh COMMAND [args]   (configured only by environment variables: env.example)

  setup [--plan]     create .venv and install what serving needs: the project with its tracing extra
                     (idempotent; torch's CPU build unless `nvidia-smi -L` lists a GPU, TORCH_BUILD=cpu|cuda
                     overrides; the other packages within constraints.txt) and the int8 kernel; no test
                     tools; --plan prints the steps without running them (`--plan test`: the test path's)
  test [pytest args] setup with the test extra and the tools the tests drive (as root with apt: prometheus,
                     python3-doc, Docker, debootstrap; checkov), ruff and mypy, then the test suite with tiny stand-ins, offline: alone,
                     the whole suite on two workers; with pytest args, in one process as they say
                     (-m "not slow": the fast subset; -n logical: on the two workers too)
  demo [--interval-s S]
                     setup, build demo data and stand-ins if missing, start the three nodes, ask the eight queries
  local [--restart-limit N] [--restart-window-s S] [--startup-timeout-s S] [--workers W] [--index-shards S]
        [--index-replicas R]
                     setup, build demo data and stand-ins if missing, run the nodes on 127.0.0.1 until Ctrl-C: three by
                     default, or W workers and S index shards of R nodes each (also LOCAL_WORKERS,
                     LOCAL_INDEX_SHARDS, LOCAL_INDEX_REPLICAS; the demo data is built with LOCAL_INDEX_SHARDS
                     shards); logs in logs/local/; a node that dies is restarted; --help lists the options
  models             is each of the five real models in the Hugging Face cache? prints the command that
                     fetches each missing one; exit 0 when all are present, 1 otherwise (a node never
                     builds models: stand-ins are built by .venv/bin/python -m builders.standins --profile tiny)
  data-rollout VERSION [--release-timeout-s S] [--gateways HOST:PORT] [--link DATA_ROOT/current]
                     switch the running cluster (the nodes' own settings: NODE_<n>_IP, or the names
                     WORKER_DISCOVERY and INDEX_DISCOVERY resolve to before each step) to data version VERSION,
                     built beside the current one on every machine, with no downtime: every shard loaded
                     everywhere first, then the workers switch, then the old version is released once its
                     requests end (docs/scaling.md, "Data versions"); run it again if it was interrupted
  ingest SOURCE... --out DATA/VERSION [--from DATA/PREVIOUS] [--strict] [...]
                     build a data version of one's own documents (Markdown, text, HTML, PDF, JSON lines,
                     CSV; folders walked recursively), split into passages; with --from, only what changed
                     is embedded; --help lists the options (docs/ingest.md)
  settings [--non-default]
                     print every setting's effective value and whether it is the default (secrets hidden);
                     exit 2 listing every bad value
  lock               rewrite constraints.txt from what the venv resolved (after a change to setup.cfg's requirements)
  torch-build        print the torch build setup installs here (cpu or cuda) and pip's arguments for it
  help, --help, -h   this text

  NODE_NUMBER=N ./run.sh   start node N's role (0 gateway+worker; INDEX_NODES index servers, 2 by default;
                           every other node a worker) on the port of its own NODE_N_IP (on BIND_HOST if set);
                           GET /live, /ready, /health and /settings tell how it is doing
EOF
}

cmd="${1:-}"
case "$cmd" in
  help|--help|-h) usage ;;
  lock)
    install_venv "$TEST_EXTRAS"
    { echo "# Every package the project and its test extra install, at the versions last resolved; torch is"
      echo "# pinned by run.sh per machine (CPU or CUDA build). Written by \`./run.sh lock\`: do not edit by hand."
      "$VENV/bin/pip" freeze --exclude-editable --disable-pip-version-check | grep -v -E '^(torch|triton|nvidia-)'
    } > constraints.txt.new && mv constraints.txt.new constraints.txt
    log "wrote constraints.txt"
    ;;
  setup-stamp) echo "$(setup_stamp "$(torch_build)") $SERVING_EXTRAS" ;;  # what the image writes, so a container starts offline
  torch-build) build="$(torch_build)"; echo "$build: pip install $(torch_pip_args "$build")" ;;
  setup)
    case "${2:-}" in
      --plan) setup_plan "${3:-}" ;;
      "") setup ;;
      *) echo "setup: unknown option '$2': expected --plan [test], or none" >&2; exit 2 ;;
    esac
    ;;
  test)
    setup_for_tests
    export HF_HUB_OFFLINE=1 MODEL_SOURCE=standin STANDIN_PROFILE=tiny
    shift
    # Lint and types first (pyproject.toml holds their rules): a finding stops the run.
    log "ruff check (rules: pyproject.toml)"
    "$VENV/bin/ruff" check --quiet .
    log "mypy pipeline services"
    "$VENV/bin/mypy" --no-error-summary
    # The whole suite on two workers: the integration tests wait on the processes they start about half
    # the time, and the unit tests fill it (tests/conftest.py groups them). A run given pytest arguments
    # (a module, -m "not slow") runs in one process, where the in-process tests get every core; add
    # `-n logical` to split it too.
    [[ $# -gt 0 ]] || set -- --numprocesses logical
    exec "$PY" -m pytest "$@"
    ;;
  demo)
    setup
    build_demo_data
    shift
    exec "$PY" -m tools.demo "$@"
    ;;
  local)
    setup
    build_demo_data
    shift
    exec "$PY" -m tools.local "$@"
    ;;
  models)
    setup
    shift
    exec "$PY" -m pipeline.provision "$@"
    ;;
  settings)
    setup
    shift
    exec "$PY" -m pipeline.config "$@"
    ;;
  data-rollout)
    setup
    shift
    exec "$PY" -m tools.data_rollout "$@"
    ;;
  ingest)
    setup
    shift
    exec "$PY" -m builders.ingest "$@"
    ;;
  "")
    if [[ -z "${NODE_NUMBER:-}" ]]; then
      usage >&2
      exit 2
    fi
    setup
    exec "$PY" -m services.node
    ;;
  *)
    echo "unknown subcommand '$cmd': expected setup, test, demo, local, models, data-rollout, ingest, settings, lock, torch-build or help (or none with NODE_NUMBER set)" >&2
    exit 2
    ;;
esac
