#!/usr/bin/env bash
# Installs and starts what tests/integration/test_containers.py needs: a Docker daemon (Debian's
# docker.io: dockerd and a client of its own version, whose BuildKit builds the image's secret
# mounts) and debootstrap (deploy/make-base-image.sh makes the base image offline). hadolint and
# Docker Compose come with the test extra (setup.cfg). Called by `./run.sh test`; it never fails
# the run: where it cannot install or start the daemon, it says so and the container tests skip.
set -u

LOG_DIR="${RAG_DOCKERD_LOG_DIR:-/var/log}"
skip() { echo "install-container-tools: $1; tests/integration/test_containers.py will be skipped"; exit 0; }
daemon_up() { timeout 10 /usr/bin/docker info >/dev/null 2>&1; }

[[ -x /usr/bin/docker && -x /usr/sbin/dockerd ]] && command -v debootstrap >/dev/null 2>&1 && daemon_up && exit 0
[[ "$(id -u)" == 0 ]] || skip "no running Docker daemon and not root (install docker.io and debootstrap, start dockerd)"
command -v apt-get >/dev/null 2>&1 || skip "no running Docker daemon and no apt-get"

# shellcheck source=deploy/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
started=$SECONDS
if [[ ! -x /usr/sbin/dockerd || ! -x /usr/bin/docker ]] || ! command -v debootstrap >/dev/null 2>&1; then
  # apt_install starts no service: this script starts dockerd itself, below.
  apt_install docker.io debootstrap
  [[ -x /usr/sbin/dockerd ]] || skip "could not install docker.io ($APT_ERROR)"
fi

# dockerd as a background process (no init system is assumed): overlay2 first, vfs where the
# filesystem refuses overlay mounts (slower, always works).
start_daemon() {
  nohup /usr/sbin/dockerd "$@" >"$LOG_DIR/rag-dockerd.log" 2>&1 &
  local pid=$! waited=0
  while (( waited < 30 )); do
    daemon_up && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 1; waited=$((waited + 1))
  done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  return 1
}
if ! daemon_up; then
  start_daemon || start_daemon --storage-driver=vfs \
    || skip "dockerd did not start ($(tail -1 "$LOG_DIR/rag-dockerd.log" 2>/dev/null))"
fi
echo "install-container-tools: Docker $(/usr/bin/docker version --format '{{.Server.Version}}' 2>/dev/null)" \
  "($(/usr/bin/docker info --format '{{.Driver}}' 2>/dev/null)) and debootstrap ready in $((SECONDS - started)) s"
