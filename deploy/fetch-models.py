"""The hub overlay's model Job (deploy/k8s-overlays/hub): downloads each model at the commit pinned
for it in MODEL_REVISIONS ("org/name=<40-hex commit>" entries, whitespace-separated) into the
Hugging Face cache, makes refs/main name that commit (the serving pods load by name, offline,
and so get exactly it), then checks the cache (`python -m pipeline.provision`, exit 1 naming any
missing). Exit 2 naming every model without a pinned commit: a branch name could move under us.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.models import ALL_MODELS  # noqa: E402  (after the path above)

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
    from huggingface_hub import snapshot_download

    for name in ALL_MODELS:
        snapshot = Path(snapshot_download(name, revision=revisions[name]))
        refs = snapshot.parents[1] / "refs"
        refs.mkdir(exist_ok=True)
        (refs / "main").write_text(revisions[name])
    from pipeline.provision import main as check
    return check([])


if __name__ == "__main__":
    sys.exit(main())
