#!/bin/sh
# Fills this pod's own data volume, unless it already holds what the node reads (DOCUMENTS_DIR's
# documents.db and every index file of INDEX_SHARDS beside FAISS_INDEX_PATH: the node's own
# startup check, pipeline.shards.shard_file_problems): the demo support corpus (DEMO_DOCS
# documents, 2000 by default) and its index, built with the stand-in embedder (MODEL_SOURCE=standin,
# built into STANDIN_HOME first) or the real one (hub). deploy/k8s runs it as an init container.
# For your own corpus, replace this with a copy from where you keep the built files.
set -eu
cd "$(dirname "$0")/.."
if python - <<'PY'
import os
import sys
from pathlib import Path

from pipeline.shards import shard_file_problems

problems = shard_file_problems(os.environ["FAISS_INDEX_PATH"], int(os.environ.get("INDEX_SHARDS", "1")))
if not (Path(os.environ["DOCUMENTS_DIR"]) / "documents.db").is_file():
    problems.append(f"{os.environ['DOCUMENTS_DIR']}/documents.db is missing")
sys.exit(1 if problems else 0)
PY
then
  exit 0
fi
if [ "${MODEL_SOURCE:-auto}" = standin ]; then
  python -m builders.standins --profile "${STANDIN_PROFILE:-tiny}" --hf-home "$STANDIN_HOME" --quiet
fi
exec python -m builders.data build --out "$(dirname "$FAISS_INDEX_PATH")" --kind support \
  --docs "${DEMO_DOCS:-2000}" --shards "${INDEX_SHARDS:-1}" --force --no-progress
