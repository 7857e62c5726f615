#!/bin/sh
# Ships a data version built once elsewhere into this pod's own data root: deploy/k8s runs it as each
# pod's init container, after the rag-ingest Job (ingest-job.yaml) has built the version into the
# shared store. It only copies: it never builds nor ingests (a new worker scaling up copies the
# corpus; it does not rebuild it), so a pod needs no embedder, and every pod serves the same bytes.
#   DATA_STORE (/versions)  the shared store, mounted read-only: <store>/<version> as the Job built it,
#                           and <store>/.standins, the stand-in models it embedded with.
#   DATA_VERSION (v1)       the version this pod serves. Unless <root>/DATA_VERSION is complete (its
#                           manifest loads and every file it names is there), it is copied from the
#                           store once the store's copy is complete (the Job writes the manifest last),
#                           waiting for it up to DATA_WAIT_S seconds (3600: the Job may still be
#                           ingesting; then exit 1). The copy is checked against the manifest's sha256
#                           of every index file (the quantizer of centroid shards and the recall
#                           queries included) before it is renamed into place: a copy that differs
#                           is removed and the pod fails.
#   DATA_CURRENT (set)      set: <root>/current names DATA_VERSION (the serving container cannot move
#                           the link, so the settings say which version a starting pod serves);
#                           keep: a link that exists stays (an in-place copy beside the served version).
#   MODEL_SOURCE=standin    the stand-ins are copied from <store>/.standins into STANDIN_HOME too,
#                           unless it is empty (an index pod: it loads no model) or already there
#                           (the data was embedded with exactly these: the worker's embedder check).
# The data root is FAISS_INDEX_PATH's grandparent, as in deploy/fill-data.sh. A copy lands under a
# temporary name and is renamed whole, so a killed copy leaves no half version.
set -eu
cd "$(dirname "$0")/.."
link="$(dirname "$FAISS_INDEX_PATH")"
root="$(dirname "$link")"
# shellcheck source=deploy/current-link.sh
. deploy/current-link.sh  # the cd above: the repository root
store="${DATA_STORE:-/versions}"
version="${DATA_VERSION:-v1}"
wait_s="${DATA_WAIT_S:-3600}"
case "${DATA_CURRENT:-set}" in
  keep|set) ;;
  *) echo "copy-data: DATA_CURRENT='$DATA_CURRENT' is not valid: expected keep or set" >&2; exit 2 ;;
esac

complete() {  # the manifest loads and names files that are all there (no hashing: polled)
  python -m builders.manifest verify --no-hashes "$1" 2>/dev/null
}

copy_whole() {  # $1 to $2, under a temporary folder renamed at the end; $3 = verify: the copy checked first
  # The copy keeps its own name inside the temporary folder: a version lies in a folder of its name.
  scratch="$(dirname "$2")/.partial-$(basename "$2")"
  partial="$scratch/$(basename "$2")"
  rm -rf "$scratch"
  mkdir -p "$scratch"
  cp -R "$1" "$partial"
  if [ "${3:-}" = verify ] && ! python -m builders.manifest verify "$partial"; then
    rm -rf "$scratch"
    echo "copy-data: the copy of $1 is not the version its manifest describes (above); nothing copied" >&2
    exit 1
  fi
  mv -T "$partial" "$2"
  rmdir "$scratch"
}

waited=0
until complete "$store/$version"; do
  if [ "$waited" -ge "$wait_s" ]; then
    echo "copy-data: $store/$version is not a complete version after ${wait_s}s: has the rag-ingest Job built it? (kubectl -n rag logs job/rag-ingest)" >&2
    exit 1
  fi
  [ "$waited" -eq 0 ] && echo "copy-data: waiting for the rag-ingest Job to build $version into $store"
  sleep 5
  waited=$((waited + 5))
done

if [ "${MODEL_SOURCE:-auto}" = standin ] && [ -n "${STANDIN_HOME:-}" ] && [ ! -d "$STANDIN_HOME" ]; then
  copy_whole "$store/.standins/home" "$STANDIN_HOME"
fi

if complete "$root/$version"; then
  echo "copy-data: $version is already here"
else
  rm -rf "${root:?}/$version"  # an incomplete copy from an older store's version of the same name
  copy_whole "$store/$version" "$root/$version" verify
  echo "copy-data: copied $version from $store"
fi

if [ "${DATA_CURRENT:-set}" = set ] || [ ! -L "$link" ]; then
  point_current "$version" copy-data
else
  echo "copy-data: $link stays -> $(readlink "$link")"
fi
