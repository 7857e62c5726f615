"""The hub overlay's model Job (deploy/k8s-overlays/hub): downloads each model at the commit pinned
for it in MODEL_REVISIONS ("org/name=<40-hex commit>" entries, whitespace-separated) into the
Hugging Face cache (the serving pods load each at that commit, `revision=`, offline: pipeline.models'
own MODEL_REVISIONS), then checks the cache (`python -m pipeline.provision`, exit 1 naming any
missing). Exit 2 naming every model without a pinned commit (a branch name could move under us) or
pinned at another commit than the nodes load.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.models import ALL_MODELS, MODEL_REVISIONS  # noqa: E402  (after the path above)

COMMIT = re.compile(r"[0-9a-f]{40}")


def pinned(text: str) -> dict[str, str]:
    """MODEL_REVISIONS' entries: model name -> commit."""
    return dict(entry.split("=", 1) for entry in text.split() if "=" in entry)


def unpinned(revisions: dict[str, str]) -> list[str]:
    return [name for name in ALL_MODELS if not COMMIT.fullmatch(revisions.get(name, ""))]


def main() -> int:
    revisions = pinned(os.environ.get("MODEL_REVISIONS", ""))
    missing = unpinned(revisions)
    if missing:
        print("MODEL_REVISIONS must pin a 40-hex commit for each model; none for: " + ", ".join(missing)
              + " (python -c \"from huggingface_hub import HfApi; print(HfApi().model_info('NAME').sha)\")",
              file=sys.stderr)
        return 2
    other = [f"{name}={revisions[name]} (the nodes load {MODEL_REVISIONS[name]})" for name in ALL_MODELS
             if revisions[name] != MODEL_REVISIONS[name]]
    if other:
        print("MODEL_REVISIONS pins other commits than pipeline/models.py's MODEL_REVISIONS, which the nodes "
              "load: " + ", ".join(other), file=sys.stderr)
        return 2
    from huggingface_hub import snapshot_download

    for name in ALL_MODELS:
        snapshot_download(name, revision=revisions[name])
    from pipeline.provision import main as check
    return check([])


if __name__ == "__main__":
    sys.exit(main())
