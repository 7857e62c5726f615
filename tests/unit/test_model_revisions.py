"""Real models load at the commit pinned for each (pipeline.models.MODEL_REVISIONS), whatever the
cache's `main` names: a model moved on the hub changes nothing until the table does. Stand-ins load
their own snapshot."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pipeline import spec
from pipeline.classifiers import ToxicityClassifier
from pipeline.config import REPO_ROOT
from pipeline.data_version import embedder_info
from pipeline.embedder import Embedder
from pipeline.models import ALL_MODELS, MODEL_REVISIONS, ModelSource, hub_repo_folder, model_is_cached

MOVED = "f" * 40  # a newer commit `main` has moved to, whose files would break the service


def test_every_model_has_a_pinned_commit_and_the_hub_overlay_fetches_the_same():
    assert set(MODEL_REVISIONS) == set(ALL_MODELS)
    assert all(re.fullmatch(r"[0-9a-f]{40}", commit) for commit in MODEL_REVISIONS.values())
    env = (REPO_ROOT / "deploy" / "k8s-overlays" / "hub" / "model-revisions.env").read_text()
    line = re.search(r"^MODEL_REVISIONS=(.*)$", env, flags=re.M).group(1)
    assert dict(entry.split("=", 1) for entry in line.split()) == MODEL_REVISIONS


@pytest.fixture(scope="module")
def moved_cache(model_source, tmp_path_factory) -> Path:
    """A hub cache whose `main` has moved to a commit with a broken config, beside the pinned
    commit's files (the tiny stand-ins, filed under MODEL_REVISIONS)."""
    cache = tmp_path_factory.mktemp("moved") / "hub"
    for name in (spec.TOXICITY_MODEL, spec.EMBEDDER_MODEL):
        folder = cache / hub_repo_folder(name)
        (snapshot,) = (model_source.cache_dir / hub_repo_folder(name) / "snapshots").iterdir()
        shutil.copytree(snapshot, folder / "snapshots" / MODEL_REVISIONS[name], symlinks=True)
        shutil.copytree(snapshot, folder / "snapshots" / MOVED, symlinks=True)
        for config in (folder / "snapshots" / MOVED).rglob("config.json"):
            config.unlink()
            config.write_text("{not json")
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(MOVED)
    return cache


def test_a_hub_model_loads_at_its_pinned_commit_not_at_main(moved_cache, fp32, toxicity, embedder):
    hub = ModelSource("hub", moved_cache, local_files_only=True)
    assert hub.hf_kwargs(spec.TOXICITY_MODEL)["revision"] == MODEL_REVISIONS[spec.TOXICITY_MODEL]
    # The pinned commit's weights: the same answers as the models those files came from.
    texts = ["you are kind", "where is my order?"]
    assert ToxicityClassifier.load(hub, fp32).classify(texts) == toxicity.classify(texts)
    assert (Embedder.load(hub, fp32).embed(texts) == embedder.embed(texts)).all()
    # `main` (no revision) is the broken commit: what the service would have loaded unpinned.
    unpinned = {k: v for k, v in hub.hf_kwargs(spec.TOXICITY_MODEL).items() if k != "revision"}
    from transformers import AutoConfig
    with pytest.raises(OSError, match="config.json"):  # transformers: not a valid JSON file
        AutoConfig.from_pretrained(spec.TOXICITY_MODEL, **unpinned)


def test_the_cache_check_and_the_data_manifest_name_the_pinned_commit(moved_cache, model_source):
    assert model_is_cached(spec.TOXICITY_MODEL, moved_cache)
    shutil.rmtree(moved_cache / hub_repo_folder(spec.TOXICITY_MODEL) / "snapshots" / MODEL_REVISIONS[spec.TOXICITY_MODEL])
    assert not model_is_cached(spec.TOXICITY_MODEL, moved_cache)  # only `main`'s commit is not enough
    hub = ModelSource("hub", moved_cache, local_files_only=True)
    assert embedder_info(hub, "float32", 768).revision == MODEL_REVISIONS[spec.EMBEDDER_MODEL]
    assert model_source.revision(spec.EMBEDDER_MODEL) is None and "revision" not in model_source.hf_kwargs(
        spec.EMBEDDER_MODEL)  # stand-ins: their own snapshot
