#!/bin/sh
# Fills a data volume in the versioned layout (docs/scaling.md, "Data versions"): versions side by
# side in the data root, the nodes reading the one its `current` link names
# (FAISS_INDEX_PATH=<root>/current/faiss_index.bin, DOCUMENTS_DIR=<root>/current/documents; the root
# is FAISS_INDEX_PATH's grandparent). Compose runs it as its one-shot `data` service on the shared
# volume (KNOWLEDGE_DIR: the mounted ./knowledge), deploy/k8s as the rag-ingest Job, once, into the
# shared store every pod copies from (deploy/copy-data.sh).
#   DATA_VERSION (v1)   the version a node started on this volume serves. Unless <root>/DATA_VERSION
#                       is complete (its manifest.json, which a build writes last), it is built:
#                       with DATA_CHANGES (a changes file), from DATA_PARENT (built first if missing:
#                       python -m builders.data update, only the changed documents embedded); else in
#                       full, the demo support corpus (DEMO_DOCS documents, 2000 by default) as
#                       INDEX_SHARDS shards, with the stand-in embedder (MODEL_SOURCE=standin, built
#                       into STANDIN_HOME first) or the real one (hub).
#   KNOWLEDGE_DIR       a folder of one's own documents (docs/ingest.md): when set and not empty,
#                       the version is ingested from it (python -m builders.ingest) instead of the demo
#                       corpus; with DATA_PARENT complete (an earlier ingest) and no DATA_CHANGES, as
#                       its next version (--from: only the documents that changed are embedded).
#   KNOWLEDGE_ARCHIVE   a .tar.gz, .tar or .zip of such a folder (a path, or a name in KNOWLEDGE_DIR:
#                       the Kubernetes Job's rag-knowledge claim): unpacked into $TMPDIR (no member may
#                       lie outside it, nor be a link or device), then ingested as that folder; only
#                       unpacked when DATA_VERSION has to be built.
#   DATA_CURRENT (keep) keep: a `current` link that exists stays where a rollout left it (compose,
#                       where the rollout repoints it); one that does not is made, naming DATA_VERSION.
#                       set: `current` names DATA_VERSION (Kubernetes: the serving containers cannot
#                       write the link, so the settings name the version a starting pod serves).
# The link is replaced atomically (a new link renamed over it), and a build is complete or absent
# (a killed build leaves no manifest, and the next run builds it again). For your own corpus, put
# your built version in <root>/<version> instead (copied under a temporary name, then renamed).
set -eu
cd "$(dirname "$0")/.."
link="$(dirname "$FAISS_INDEX_PATH")"
root="$(dirname "$link")"
# shellcheck source=deploy/current-link.sh
. deploy/current-link.sh  # the cd above: the repository root
version="${DATA_VERSION:-v1}"
case "${DATA_CURRENT:-keep}" in
  keep|set) ;;
  *) echo "fill-data: DATA_CURRENT='$DATA_CURRENT' is not valid: expected keep or set" >&2; exit 2 ;;
esac

complete() {
  python -c 'import sys; from pipeline.data_version import load_version; load_version(sys.argv[1])' "$1" \
    2>/dev/null
}

if [ -n "${KNOWLEDGE_ARCHIVE:-}" ] && ! complete "$root/$version"; then
  case "$KNOWLEDGE_ARCHIVE" in
    /*) archive="$KNOWLEDGE_ARCHIVE" ;;
    *) archive="${KNOWLEDGE_DIR:?KNOWLEDGE_ARCHIVE names a file in KNOWLEDGE_DIR, which is not set}/$KNOWLEDGE_ARCHIVE" ;;
  esac
  KNOWLEDGE_DIR="${TMPDIR:-/tmp}/fill-data-knowledge"
  rm -rf "$KNOWLEDGE_DIR"
  python - "$archive" "$KNOWLEDGE_DIR" <<'PY'
import shutil, sys, tarfile
archive, out = sys.argv[1:]
if tarfile.is_tarfile(archive):
    with tarfile.open(archive) as tar:  # checked by hand too: Python before 3.11.4 has no extraction filter
        bad = [m.name for m in tar.getmembers() if not (m.isfile() or m.isdir())
               or m.name.startswith("/") or ".." in m.name.split("/")]
    if bad:
        sys.exit(f"fill-data: {archive}: not a plain file or folder inside the archive: {bad[:5]}")
    shutil.unpack_archive(archive, out, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
else:
    shutil.unpack_archive(archive, out, format="zip")  # zipfile keeps every member inside `out`
PY
  [ -n "$(ls -A "$KNOWLEDGE_DIR")" ] || { echo "fill-data: $archive holds no file" >&2; exit 1; }
  echo "fill-data: unpacked $archive"
fi

embedder_ready=""
embedder() {  # the stand-ins a build embeds with, built once (a no-op when present)
  if [ -z "$embedder_ready" ] && [ "${MODEL_SOURCE:-auto}" = standin ]; then
    python -m builders.standins --profile "${STANDIN_PROFILE:-tiny}" --hf-home "$STANDIN_HOME" --quiet
  fi
  embedder_ready=1
}

knowledge() {  # a folder of one's own documents is given and holds something (a new ext4 volume's lost+found is not)
  [ -n "${KNOWLEDGE_DIR:-}" ] && [ -d "$KNOWLEDGE_DIR" ] && [ -n "$(ls -A "$KNOWLEDGE_DIR" | grep -vx 'lost+found')" ]
}

build_in_full() {
  embedder
  if knowledge; then
    python -m builders.ingest "$KNOWLEDGE_DIR" --out "$root/$1" --shards "${INDEX_SHARDS:-1}" --force --no-progress
  else
    python -m builders.data build --out "$root/$1" --kind support --docs "${DEMO_DOCS:-2000}" \
      --shards "${INDEX_SHARDS:-1}" --force --no-progress
  fi
}

if ! complete "$root/$version"; then
  if [ -n "${DATA_CHANGES:-}" ]; then
    parent="${DATA_PARENT:?DATA_CHANGES needs DATA_PARENT: the version the changes apply to}"
    complete "$root/$parent" || build_in_full "$parent"
    embedder
    python -m builders.data update --from "$root/$parent" --out "$root/$version" --changes "$DATA_CHANGES" --force
  elif knowledge && [ -n "${DATA_PARENT:-}" ] && complete "$root/$DATA_PARENT"; then
    embedder
    python -m builders.ingest "$KNOWLEDGE_DIR" --from "$root/$DATA_PARENT" --out "$root/$version" --force --no-progress
  else
    build_in_full "$version"
  fi
fi

if [ "${DATA_CURRENT:-keep}" = set ] || [ ! -L "$link" ]; then
  point_current "$version" fill-data
else
  echo "fill-data: $version is complete; $link stays -> $(readlink "$link")"
fi
