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

export DEBIAN_FRONTEND=noninteractive
log="$(mktemp -t install-test-tools.XXXXXX)"
policy=/usr/sbin/policy-rc.d
made_policy=""
cleanup() {
  [[ -n "$made_policy" ]] && rm -f "$policy"
  rm -f "$log"
}
trap cleanup EXIT
# The package's postinst starts the prometheus service (invoke-rc.d / deb-systemd-invoke), which
# would leave a daemon on :9090; the tests only need the binaries. Both helpers ask policy-rc.d
# first, and exit 101 means "do not start": add one for the install unless one is already there.
if [[ ! -e "$policy" ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
fi

install() { apt-get install -y -qq --no-install-recommends prometheus >>"$log" 2>&1; }
started=$SECONDS
# The package lists may be fresh enough; refresh them only if the install fails without it.
if ! install; then
  apt-get update -qq >>"$log" 2>&1 && install
fi
if have_tools; then
  echo "install-test-tools: installed Debian's prometheus package ($(prometheus --version 2>&1 | head -1)) in $((SECONDS - started)) s"
else
  skip "could not install Debian's 'prometheus' package ($(grep -m1 -E '^(E|W):' "$log" || echo 'apt-get failed'))"
fi
