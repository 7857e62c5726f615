#!/usr/bin/env bash
# Installs Debian's chromium and chromium-driver for the chat page's browser test
# (tests/integration/test_chat_page.py). Called by `./run.sh test`; it never fails the run: where it
# cannot install, it prints one line saying which test will be skipped.
set -u

command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && exit 0
skip() { echo "install-browser: $1; tests/integration/test_chat_page.py will be skipped"; exit 0; }
[[ "$(id -u)" == 0 ]] || skip "chromium/chromedriver not found and not root (install Debian's 'chromium' and 'chromium-driver')"
command -v apt-get >/dev/null 2>&1 || skip "chromium/chromedriver not found and no apt-get"

# shellcheck source=deploy/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
started=$SECONDS
if apt_install chromium chromium-driver && command -v chromedriver >/dev/null 2>&1; then
  echo "install-browser: installed Debian's chromium and chromium-driver in $((SECONDS - started)) s"
else
  skip "could not install Debian's chromium and chromium-driver (${APT_ERROR:-apt-get failed})"
fi
