"""Which weights the stages load: the real models from the hub, or stand-ins.

The stand-ins live in a hub cache of their own under the real names, so the
loading code in each stage is the same for both; only `cache_dir` differs.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline import spec
from pipeline.config import Settings

log = logging.getLogger(__name__)

ALL_MODELS = (spec.EMBEDDER_MODEL, spec.RERANKER_MODEL, spec.GENERATOR_MODEL,
              spec.SENTIMENT_MODEL, spec.TOXICITY_MODEL)


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "hub" or "standin"
    cache_dir: Path | None  # the hub cache folder to read; None = huggingface_hub's default
    local_files_only: bool
    profile: str | None = None

    @property
    def is_standin(self) -> bool:
        return self.kind == "standin"

    def describe(self) -> str:
        if self.is_standin:
            return f"standin:{self.profile}"
        return "hub"

    def hf_kwargs(self) -> dict:
        """Keyword arguments for every from_pretrained call."""
        kwargs: dict = {"local_files_only": self.local_files_only}
        if self.cache_dir is not None:
            kwargs["cache_dir"] = str(self.cache_dir)
        return kwargs


def real_models_cached() -> bool:
    from huggingface_hub import try_to_load_from_cache
    return all(isinstance(try_to_load_from_cache(name, "config.json"), str) for name in ALL_MODELS)


def hub_reachable(timeout_s: float = 3.0) -> bool:
    try:
        import requests
        from huggingface_hub import constants
        requests.head(constants.ENDPOINT, timeout=timeout_s)
        return True
    except Exception:  # any failure means "not reachable from here"
        return False


def standin_source(settings: Settings, build: bool = True) -> ModelSource:
    from builders import standins  # lazily: only a stand-in source needs the builder
    home = settings.standin_dir
    if build and not standins.is_built(home, settings.standin_profile):
        log.warning("building %s stand-in models in %s (first use)", settings.standin_profile, home)
        standins.build_standins(settings.standin_profile, home)
    return ModelSource("standin", home / "hub", True, settings.standin_profile)


def resolve_model_source(settings: Settings, *, cached: Callable[[], bool] = real_models_cached,
                         reachable: Callable[[], bool] = hub_reachable) -> ModelSource:
    if settings.model_source == "standin":
        source = standin_source(settings)
    elif settings.model_source == "hub":
        source = ModelSource("hub", None, settings.hf_hub_offline)
    elif cached():
        source = ModelSource("hub", None, True)
    elif not settings.hf_hub_offline and reachable():  # offline: not even a look
        source = ModelSource("hub", None, False)
    else:
        source = standin_source(settings)
    announce(source)
    return source


def announce(source: ModelSource) -> None:
    """Loud on purpose: nobody should mistake a stand-in's words for a real answer."""
    if source.is_standin:
        log.warning("*" * 72)
        log.warning("MODEL SOURCE: STAND-INS (%s profile, random weights) from %s", source.profile, source.cache_dir)
        log.warning("answers are NOT meaningful; set MODEL_SOURCE=hub on a machine with the real models")
        log.warning("*" * 72)
    else:
        log.info("model source: real models from the Hugging Face hub%s",
                 " (local cache only)" if source.local_files_only else "")
