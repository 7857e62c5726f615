#!/bin/sh
# Waits until the data volume holds what the nodes read: DOCUMENTS_DIR/documents.db and every
# index file of INDEX_SHARDS beside FAISS_INDEX_PATH (pipeline.shards.shard_file_problems, the
# node's own startup check). deploy/k8s runs it as an init container while the data Job builds.
set -eu
cd "$(dirname "$0")/.."
until .venv/bin/python - <<'PY'
import os
import sys
from pathlib import Path

from pipeline.shards import shard_file_problems

problems = shard_file_problems(os.environ["FAISS_INDEX_PATH"], int(os.environ.get("INDEX_SHARDS", "1")))
if not (Path(os.environ["DOCUMENTS_DIR"]) / "documents.db").is_file():
    problems.append(f"{os.environ['DOCUMENTS_DIR']}/documents.db is missing")
for problem in problems:
    print(f"waiting for the data: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
do
  sleep 10
done
