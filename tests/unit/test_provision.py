"""Provisioning: which real models the hub cache lacks, the command that fetches each, and a source
that fails at once (one line) instead of retrying for a minute when they cannot be fetched, or of
building stand-ins inside a serving node."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline import provision
from pipeline.config import ConfigError, Settings
from pipeline.models import (
    ALL_MODELS,
    MODEL_REVISIONS,
    STANDIN_MARKER,
    STANDIN_VERSION,
    ModelsMissing,
    fetch_command,
    missing_models,
    resolve_model_source,
    standins_built,
)


@pytest.fixture(scope="module")
def full_cache(model_source, tmp_path_factory) -> Path:
    """A hub cache holding all five at their pinned commits, as `hf download --revision` leaves it:
    the tiny stand-ins (which live in one under the real names) re-filed under MODEL_REVISIONS."""
    cache = tmp_path_factory.mktemp("pinned") / "hub"
    for name in ALL_MODELS:
        folder = "models--" + name.replace("/", "--")
        (snapshot,) = (model_source.cache_dir / folder / "snapshots").iterdir()
        shutil.copytree(snapshot, cache / folder / "snapshots" / MODEL_REVISIONS[name], symlinks=True)
        (cache / folder / "refs").mkdir()
        (cache / folder / "refs" / "main").write_text(MODEL_REVISIONS[name])
    return cache


def partial_cache(full_cache: Path, tmp_path: Path, keep: set[str], weights: bool = True) -> Path:
    cache = tmp_path / "hub"
    for name in keep:
        folder = "models--" + name.replace("/", "--")
        shutil.copytree(full_cache / folder, cache / folder, symlinks=True)
        if not weights:
            for weight in (cache / folder).rglob("*.safetensors"):
                weight.unlink()
    return cache


def test_missing_models_names_those_not_cached_with_their_weights(full_cache, tmp_path):
    assert missing_models(full_cache) == []
    assert missing_models(tmp_path / "empty") == list(ALL_MODELS)
    cache = partial_cache(full_cache, tmp_path, {ALL_MODELS[0], ALL_MODELS[2]})
    assert missing_models(cache) == [ALL_MODELS[1], *ALL_MODELS[3:]]


def test_a_model_whose_weights_are_missing_counts_as_missing(full_cache, tmp_path):
    cache = partial_cache(full_cache, tmp_path, {ALL_MODELS[1]}, weights=False)
    assert ALL_MODELS[1] in missing_models(cache)


def test_fetch_command_is_huggingface_hubs_download():
    command = fetch_command("BAAI/bge-base-en-v1.5")
    assert command.split()[-4:] == ["download", "BAAI/bge-base-en-v1.5", "--revision",
                                    MODEL_REVISIONS["BAAI/bge-base-en-v1.5"]]  # the commit a node loads
    assert Path(command.split()[0]).name in ("hf", "huggingface-cli")
    assert fetch_command("a/b", Path("/x")).endswith("download a/b --cache-dir /x")


def test_provision_lists_each_missing_model_with_its_command_and_exits_1(full_cache, tmp_path, capsys):
    cache = partial_cache(full_cache, tmp_path, {ALL_MODELS[0]})
    assert provision.main(["--cache-dir", str(cache)]) == 1
    out = capsys.readouterr().out
    assert f"present  {ALL_MODELS[0]}" in out
    for name in ALL_MODELS[1:]:
        assert f"missing  {name}" in out
        assert f"  {fetch_command(name, cache)}\n" in out  # the command alone on its line, to copy
    assert "4 of 5 models missing" in out


def test_provision_exits_0_when_all_are_present(full_cache, capsys):
    assert provision.main(["--cache-dir", str(full_cache)]) == 0
    assert "all 5 models present" in capsys.readouterr().out


def hub_settings(**env: str) -> Settings:
    return Settings.from_env({"MODEL_SOURCE": "hub", **env})


def test_hub_source_without_the_models_and_without_the_hub_fails_at_once_in_one_line():
    probes = []

    def unreachable():
        probes.append(1)
        return False

    with pytest.raises(ModelsMissing) as err:
        resolve_model_source(hub_settings(), missing=lambda: list(ALL_MODELS[3:]), reachable=unreachable)
    message = str(err.value)
    assert isinstance(err.value, ConfigError) and "\n" not in message and probes == [1]
    assert "cannot be reached" in message
    for name in ALL_MODELS[3:]:
        assert name in message and fetch_command(name) in message
    assert ALL_MODELS[0] not in message


def test_offline_hub_source_without_the_models_fails_without_looking_at_the_hub():
    def reachable():
        raise AssertionError("an offline node must not contact the hub")

    with pytest.raises(ModelsMissing, match="HF_HUB_OFFLINE is set"):
        resolve_model_source(hub_settings(HF_HUB_OFFLINE="1"), missing=lambda: [ALL_MODELS[0]], reachable=reachable)


def test_hub_source_with_every_model_cached_reads_only_the_cache_when_the_hub_is_unreachable():
    # Otherwise huggingface_hub retries each file against the unreachable hub for about a minute.
    source = resolve_model_source(hub_settings(), missing=lambda: [], reachable=lambda: False)
    assert source.kind == "hub" and source.local_files_only
    online = resolve_model_source(hub_settings(), missing=lambda: [ALL_MODELS[0]], reachable=lambda: True)
    assert online.kind == "hub" and not online.local_files_only  # it downloads what is missing


def test_a_standin_source_without_built_standins_fails_at_once_naming_the_build_command(tmp_path):
    home = tmp_path / "standins"
    settings = Settings.from_env({"MODEL_SOURCE": "standin", "STANDIN_PROFILE": "tiny", "STANDIN_HOME": str(home)})
    with pytest.raises(ModelsMissing) as err:
        resolve_model_source(settings)
    message = str(err.value)
    assert isinstance(err.value, ConfigError) and "\n" not in message
    assert f"python -m builders.standins --profile tiny --hf-home {home}" in message
    assert not home.exists()  # a serving node never builds models


def test_auto_with_no_real_models_and_no_standins_fails_naming_both_commands(tmp_path):
    home = tmp_path / "standins"
    settings = Settings.from_env({"MODEL_SOURCE": "auto", "HF_HUB_OFFLINE": "1", "STANDIN_HOME": str(home)})

    def reachable():
        raise AssertionError("an offline node must not contact the hub")

    with pytest.raises(ModelsMissing) as err:
        resolve_model_source(settings, missing=lambda: list(ALL_MODELS), reachable=reachable)
    message = str(err.value)
    assert "./run.sh models" in message and "HF_HUB_OFFLINE is set" in message
    assert f"python -m builders.standins --profile {settings.models.standin_profile} --hf-home {home}" in message
    assert not home.exists()


def test_auto_with_no_real_models_reads_the_standins_built_beforehand(model_source):
    home = model_source.cache_dir.parent
    settings = Settings.from_env({"MODEL_SOURCE": "auto", "HF_HUB_OFFLINE": "1", "STANDIN_PROFILE": "tiny",
                                  "STANDIN_HOME": str(home)})
    source = resolve_model_source(settings, missing=lambda: list(ALL_MODELS), reachable=lambda: False)
    assert source == model_source


def test_standins_count_as_built_only_when_complete_and_of_this_version(model_source, tmp_path):
    home = model_source.cache_dir.parent
    assert standins_built(home, "tiny") and not standins_built(home, "faithful")
    assert standins_built(home, "tiny", seed=0) and not standins_built(home, "tiny", seed=1)
    copy = tmp_path / "copy"
    shutil.copytree(home, copy, symlinks=True)
    marker = json.loads((copy / STANDIN_MARKER).read_text())
    (copy / STANDIN_MARKER).write_text(json.dumps({**marker, "version": STANDIN_VERSION - 1}))
    assert not standins_built(copy, "tiny")  # stale: the builder rebuilds it
    (copy / STANDIN_MARKER).write_text(json.dumps(marker))
    assert standins_built(copy, "tiny")
    shutil.rmtree(next((copy / "hub").iterdir()))
    assert not standins_built(copy, "tiny")


def test_provision_names_the_standin_builder_as_the_alternative(tmp_path, capsys):
    assert provision.main(["--cache-dir", str(tmp_path / "empty")]) == 1
    assert "python -m builders.standins --profile tiny" in capsys.readouterr().out
