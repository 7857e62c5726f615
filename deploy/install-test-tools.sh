#!/usr/bin/env bash
# Installs the tools the tests drive as real processes: checkov (tests/unit/test_k8s_manifests.py),
# from PyPI into a virtual environment of its own, .cache/checkov (its pins conflict with the
# project's test environment); Debian's `python3-doc` (Python's HTML documentation, the real corpus
# tests/integration/test_ingest_python_docs.py ingests); and Debian's `prometheus` package (the server
# and promtool, tests/integration/test_prometheus.py). Called by `./run.sh test`; it never fails the run: where it
# cannot install, it prints one line saying which test will be skipped.
set -u

CHECKOV_VERSION=3.3.30
checkov_venv="$(cd "$(dirname "$0")/.." && pwd)/.cache/checkov"
# Its venv's scripts name the interpreter by the path it was made at: a checkout moved or copied
# keeps a checkov that cannot start, so it is made anew unless its interpreter runs.
if [[ ! -x "$checkov_venv/bin/checkov" ]] || ! "$checkov_venv/bin/python" -c "" >/dev/null 2>&1 \
    || [[ "$(head -1 "$checkov_venv/bin/checkov")" != "#!$checkov_venv/bin/python"* ]]; then
  started=$SECONDS
  rm -rf "$checkov_venv"
  if python3 -m venv "$checkov_venv" >/dev/null 2>&1 \
      && "$checkov_venv/bin/pip" install -q "checkov==$CHECKOV_VERSION" >/dev/null 2>&1; then
    echo "install-test-tools: installed checkov $CHECKOV_VERSION in $checkov_venv in $((SECONDS - started)) s"
  else
    echo "install-test-tools: could not install checkov from PyPI; its test in tests/unit/test_k8s_manifests.py will be skipped"
  fi
fi

# shellcheck source=deploy/apt-install.sh
. "$(dirname "$0")/apt-install.sh"

PYTHON_DOCS=/usr/share/doc/python3/html/library/index.html
if [[ ! -f "$PYTHON_DOCS" ]]; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1 && apt_install python3-doc && [[ -f "$PYTHON_DOCS" ]]; then
    echo "install-test-tools: installed Debian's python3-doc"
  else
    echo "install-test-tools: could not install Debian's python3-doc (needs root and apt-get); tests/integration/test_ingest_python_docs.py will be skipped"
  fi
fi

have_tools() { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; }

skip() { echo "install-test-tools: $1; tests/integration/test_prometheus.py will be skipped"; exit 0; }

have_tools && exit 0  # the usual case: nothing to do, nothing printed
[[ "$(id -u)" == 0 ]] || skip "prometheus/promtool not found and not root (install Debian's 'prometheus' package)"
command -v apt-get >/dev/null 2>&1 || skip "prometheus/promtool not found and no apt-get"

# The package's postinst would leave a prometheus daemon on :9090; the tests only need the
# binaries, and apt_install starts no service.
started=$SECONDS
apt_install prometheus
if have_tools; then
  echo "install-test-tools: installed Debian's prometheus package ($(prometheus --version 2>&1 | head -1)) in $((SECONDS - started)) s"
else
  skip "could not install Debian's 'prometheus' package ($APT_ERROR)"
fi
