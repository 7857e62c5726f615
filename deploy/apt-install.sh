# Sourced by deploy/install-test-tools.sh and deploy/install-container-tools.sh (as root, with apt-get).
#
# apt_install PACKAGE...: install Debian packages without starting their services; returns apt-get's
# status, and sets APT_ERROR to its first error or warning line (what to report when it failed).
apt_install() {
  local log policy=/usr/sbin/policy-rc.d made_policy="" rc
  log="$(mktemp -t apt-install.XXXXXX)"
  # A package's postinst starts its service through invoke-rc.d / deb-systemd-invoke, which ask
  # policy-rc.d first: exit 101 means "do not start". One is added for the install unless present.
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
  fi
  # The package lists may be fresh enough: they are refreshed only if the install fails without it.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >>"$log" 2>&1 \
    || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$log" 2>&1 \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >>"$log" 2>&1; }
  rc=$?
  APT_ERROR="$(grep -m1 -E '^(E|W):' "$log" || echo 'apt-get failed')"
  [[ -n "$made_policy" ]] && rm -f "$policy"
  rm -f "$log"
  return "$rc"
}
