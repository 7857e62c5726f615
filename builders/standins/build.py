"""Building the five stand-ins into a hub cache, once: idempotent, locked against a concurrent build,
and committed so that an interrupted build never looks complete (the marker is written last)."""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pathlib
import shutil
import time
import uuid
from typing import Any, Iterator

from builders.standins.profiles import MODEL_NAMES, check_profile, model_configs
from builders.standins.repos import build_repo, write_text
from builders.standins.tokenizing import dumps
from pipeline.config import Settings
from pipeline.models import (
    STANDIN_MARKER,
    STANDIN_VERSION,
    ModelsMissing,
    ModelSource,
    resolve_model_source,
    standin_marker,
    standins_built,
)

log = logging.getLogger(__name__)

BANNER = (
    "\n"
    "############################################################################\n"
    "#  STAND-IN MODELS: random weights, NOT the real checkpoints.               #\n"
    "#  Shapes, tokenizers and timings are realistic; every output (embeddings, #\n"
    "#  rerank scores, sentiment, toxicity, generated text) is noise.           #\n"
    "############################################################################"
)


def default_standin_home(profile: str) -> pathlib.Path:
    """``<repo root>/.cache/standins/<profile>`` (git-ignored via ``.cache/``).

    The settings' own default, read with an empty environment so that
    STANDIN_HOME does not change it (the CLI's ``--hf-home`` does that).
    """
    check_profile(profile)
    return Settings.from_env({"STANDIN_PROFILE": profile}).standin_dir


def standin_env(hf_home: str | os.PathLike) -> dict[str, str]:
    """Environment variables that make the HF libraries load from ``hf_home`` offline.

    huggingface_hub reads these at import time, so set them before importing
    transformers / sentence_transformers (or pass them to a subprocess).
    """
    return {
        "HF_HOME": str(pathlib.Path(hf_home).resolve()),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


def read_marker(hf_home: str | os.PathLike) -> dict[str, Any] | None:
    return standin_marker(pathlib.Path(hf_home))


def is_built(hf_home: str | os.PathLike, profile: str, seed: int | None = None) -> bool:
    """True when a complete build of ``profile`` (and ``seed``, if given) is in ``hf_home``."""
    check_profile(profile)
    return standins_built(pathlib.Path(hf_home), profile, seed)


@contextlib.contextmanager
def _build_lock(hf_home: pathlib.Path) -> Iterator[None]:
    """Serialise concurrent builds of the same home (e.g. several workers starting at once)."""
    with open(hf_home.parent / f".{hf_home.name}.lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # released when the file closes
        yield


def _commit(tmp: pathlib.Path, hf_home: pathlib.Path) -> None:
    """Move a finished build into place; the marker is the last thing to appear."""
    try:
        os.rename(tmp, hf_home)  # atomic when hf_home is absent or an empty dir
        return
    except OSError:
        pass
    # hf_home already holds something (an older build, or a shared HF cache):
    # swap only our five repos, never touching anything else in it, and never
    # replacing a real download that happens to live there.
    hub = hf_home / "hub"
    for repo in (tmp / "hub").iterdir():
        if (hub / repo.name).exists() and not _is_standin_repo(hub / repo.name):
            raise RuntimeError(
                f"{hub / repo.name} holds a real (non-stand-in) model; refusing to overwrite it. "
                "Use a dedicated --hf-home for stand-ins."
            )
    (hf_home / STANDIN_MARKER).unlink(missing_ok=True)
    hub.mkdir(parents=True, exist_ok=True)
    for repo in sorted((tmp / "hub").iterdir()):
        dest = hub / repo.name
        trash = hub / f".{repo.name}.old-{uuid.uuid4().hex[:8]}"
        if dest.exists():
            os.rename(dest, trash)
        os.rename(repo, dest)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp / STANDIN_MARKER, hf_home / STANDIN_MARKER)


def _is_standin_repo(repo: pathlib.Path) -> bool:
    snapshots = list((repo / "snapshots").glob("*"))
    return bool(snapshots) and all(
        (snap / "README.md").is_file() and (snap / "README.md").read_text(errors="replace").startswith("# STAND-IN")
        for snap in snapshots
    )


def dir_size(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build_standins(
    profile: str,
    hf_home: str | os.PathLike | None = None,
    seed: int = 0,
    force: bool = False,
    progress: bool = True,
) -> pathlib.Path:
    """Build the five stand-ins into ``hf_home`` (default: :func:`default_standin_home`).

    Idempotent: returns at once when that profile and seed are already built,
    unless ``force``. Builds in a sibling temp dir and moves it into place at the
    end, so an interrupted build never looks complete. Returns ``hf_home``.
    """
    check_profile(profile)
    hf_home = pathlib.Path(hf_home).expanduser().absolute() if hf_home else default_standin_home(profile)
    if not force and is_built(hf_home, profile, seed):
        return hf_home
    hf_home.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(hf_home):
        if not force and is_built(hf_home, profile, seed):  # built by someone we waited for
            return hf_home
        # Leftovers of interrupted builds (we hold the lock, so none is live).
        for stale in hf_home.parent.glob(f".{hf_home.name}.building-*"):
            shutil.rmtree(stale, ignore_errors=True)

        log.warning(BANNER)
        log.warning("building %s stand-ins (seed %d) into %s", profile, seed, hf_home)
        started = time.perf_counter()
        tmp = hf_home.parent / f".{hf_home.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            models = _build_all(tmp, profile, seed, progress)
            marker = {
                "profile": profile,
                "seed": seed,
                "version": STANDIN_VERSION,
                "standin": True,
                "note": "random-weight stand-ins of the real models; outputs are meaningless",
                "models": models,
                "build_seconds": round(time.perf_counter() - started, 2),
            }
            write_text(tmp / STANDIN_MARKER, dumps(marker))
            _commit(tmp, hf_home)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.warning("stand-ins ready in %s (%.1fs)", hf_home, time.perf_counter() - started)
    return hf_home


def _build_all(root: pathlib.Path, profile: str, seed: int, progress: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    hub = root / "hub"
    configs = model_configs(profile)
    models: dict[str, Any] = {}
    bar = tqdm(list(MODEL_NAMES), desc=f"stand-ins ({profile})", unit="model", disable=not progress)
    for key in bar:
        bar.set_postfix_str(MODEL_NAMES[key])
        models[key] = build_repo(hub, key, profile, seed, configs[key])
    bar.close()
    return models


def source_building_standins(settings: Settings) -> ModelSource:
    """The model source of a tool (the local cluster, the tests, a benchmark): the one a node would
    resolve, after building the stand-ins it would find missing (MODEL_SOURCE=standin, or auto with
    no real models to be had). Serving nodes never build: this is for what starts or measures them."""
    try:
        return resolve_model_source(settings)
    except ModelsMissing:
        if settings.models.model_source == "hub":
            raise
    build_standins(settings.models.standin_profile, settings.standin_dir, progress=False)
    return resolve_model_source(settings)
