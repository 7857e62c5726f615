#!/usr/bin/env bash
# Makes a local stand-in for the public Python slim image where no image registry can be reached:
# a minimal Debian bookworm (Python 3.11, as python:3.11-slim) with python3, python3-venv and the
# Python headers (python3-dev: torch's inline C++ build of pipeline/kernels/compiled.py's kernels needs
# them), built by debootstrap from the Debian mirror apt already uses and loaded as IMAGE.
#   deploy/make-base-image.sh [IMAGE]          # as root; default IMAGE rag-base:bookworm
#   docker build -f deploy/Dockerfile --build-arg BASE_IMAGE=rag-base:bookworm .
# ARCH (amd64, the default, or arm64) picks the architecture: ARCH=arm64 on an x86-64 host runs
# arm64's binaries under emulation (qemu-user-static registered with binfmt_misc; deploy/README.md,
# "arm64"). The image is loaded as a one-layer image whose config names ARCH (`docker import`
# would record the daemon's own architecture, whatever the files are).
# The root filesystem is kept as a tarball (BASE_CACHE, default .cache/docker-base/), so a
# second call only re-loads it (seconds instead of minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${1:-rag-base:bookworm}"
ARCH="${ARCH:-amd64}"
[[ "$ARCH" == amd64 || "$ARCH" == arm64 ]] || { echo "make-base-image: ARCH='$ARCH': expected amd64 or arm64" >&2; exit 2; }
CACHE="${BASE_CACHE:-.cache/docker-base}"
TARBALL="$CACHE/bookworm-python3$([[ "$ARCH" == amd64 ]] || echo "-$ARCH").tar"
DOCKER="${DOCKER:-docker}"
root="" archive=""
trap 'rm -rf ${root:+"$root" "$root.log"} ${archive:+"$archive"}' EXIT

log() { echo "make-base-image: $*" >&2; }

# The mirror of the first bookworm source apt reads (deb822 .sources or one-line .list).
mirror() {
  local uri
  uri="$(grep -hs -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)"
  [[ -n "$uri" ]] || uri="$(grep -hs -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | grep -v security | awk '{print $2}' | head -1 || true)"
  echo "${uri:-http://deb.debian.org/debian}"
}

if "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
  exit 0
fi
if [[ ! -s "$TARBALL" ]]; then
  command -v debootstrap >/dev/null || { log "debootstrap is not installed (apt-get install debootstrap)"; exit 1; }
  root="$(mktemp -d -t rag-base.XXXXXX)"
  started=$SECONDS
  log "debootstrap bookworm ($ARCH) from $(mirror) into $root"
  debootstrap --arch="$ARCH" --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
    bookworm "$root" "$(mirror)" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
  rm -f "$root.log"
  # The image's apt starts with empty lists (the build's apt-get update fills them).
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  mkdir -p "$CACHE"
  tar -C "$root" -cf "$TARBALL.part" . && mv "$TARBALL.part" "$TARBALL"
  log "root filesystem in $TARBALL ($((SECONDS - started)) s)"
fi
# docker load's archive: the root filesystem as the one layer, a config naming its architecture
# and no creation time (the same tarball gives the same image ID: builds on it stay cached).
archive="$(mktemp -d -t rag-base-image.XXXXXX)"
ln "$TARBALL" "$archive/layer.tar" 2>/dev/null || cp "$TARBALL" "$archive/layer.tar"
cat > "$archive/config.json" <<EOF
{"architecture": "$ARCH", "os": "linux",
 "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["/bin/bash"]},
 "rootfs": {"type": "layers", "diff_ids": ["sha256:$(sha256sum "$TARBALL" | cut -d' ' -f1)"]}}
EOF
echo "[{\"Config\": \"config.json\", \"RepoTags\": [\"$IMAGE\"], \"Layers\": [\"layer.tar\"]}]" > "$archive/manifest.json"
tar -C "$archive" -cf - manifest.json config.json layer.tar | "$DOCKER" load >/dev/null
log "loaded $IMAGE (linux/$ARCH)"
