#!/usr/bin/env bash
# Installs the tools tests/integration/test_prometheus.py drives as real processes: Debian's
# `prometheus` package (the server and promtool). Called by `./run.sh test`; it never fails the
# run: where it cannot install, it prints one line saying the Prometheus test will be skipped.
set -u

have_tools() { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; }

skip() { echo "install-test-tools: $1; tests/integration/test_prometheus.py will be skipped"; exit 0; }

have_tools && exit 0  # the usual case: nothing to do, nothing printed
[[ "$(id -u)" == 0 ]] || skip "prometheus/promtool not found and not root (install Debian's 'prometheus' package)"
command -v apt-get >/dev/null 2>&1 || skip "prometheus/promtool not found and no apt-get"

# shellcheck source=deploy/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
# The package's postinst would leave a prometheus daemon on :9090; the tests only need the
# binaries, and apt_install starts no service.
started=$SECONDS
apt_install prometheus
if have_tools; then
  echo "install-test-tools: installed Debian's prometheus package ($(prometheus --version 2>&1 | head -1)) in $((SECONDS - started)) s"
else
  skip "could not install Debian's 'prometheus' package ($APT_ERROR)"
fi
