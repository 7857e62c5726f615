"""Which weights the stages load: the real models from the hub, or stand-ins.

The stand-ins live in a hub cache of their own under the real names, so each stage loads both alike;
only `cache_dir` differs. A serving node only finds models, never makes them: with none to be had it
stops at once, naming the command that fetches the real ones or builds the stand-ins.
"""
from __future__ import annotations

import json
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from pipeline import spec
from pipeline.config import ConfigError, Settings

log = logging.getLogger(__name__)

ALL_MODELS = (spec.EMBEDDER_MODEL, spec.RERANKER_MODEL, spec.GENERATOR_MODEL,
              spec.SENTIMENT_MODEL, spec.TOXICITY_MODEL)

# The hub commit each real model is loaded at (from_pretrained's `revision`), so a model moved on the hub
# changes nothing here until this table does. The same commits as deploy/k8s-overlays/hub/model-revisions.env
# (taken from public code that loads each model at that commit; deploy/README.md, "Model revisions").
MODEL_REVISIONS = {
    spec.EMBEDDER_MODEL: "a5beb1e3e68b9ab74eb54cfd186867f64f240e1a",
    spec.RERANKER_MODEL: "2cfc18c9415c912f9d8155881c133215df768a70",
    spec.GENERATOR_MODEL: "7ae557604adf67be50417f59c2c2f167def9a775",
    spec.SENTIMENT_MODEL: "e06857fdb0325a7798a8fc361b417dfeec3a3b98",
    spec.TOXICITY_MODEL: "4d6c22e74ba2fdd26bc4f7238f50766b045a0d94",
}


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "hub", "standin" or "null" (a measurement mode: pipeline/null_models.py)
    cache_dir: Path | None  # the hub cache folder to read; None = huggingface_hub's default
    local_files_only: bool
    profile: str | None = None

    @property
    def is_standin(self) -> bool:
        return self.kind == "standin"

    @property
    def is_null(self) -> bool:
        return self.kind == "null"

    def describe(self) -> str:
        return f"{self.kind}:{self.profile}" if self.kind in ("standin", "null") else "hub"

    def revision(self, name: str) -> str | None:
        """The commit a real model is loaded at (MODEL_REVISIONS); None for stand-ins and null models (the
        stand-ins' own snapshot) and for a model not in the table (its `main`)."""
        return None if self.kind != "hub" else MODEL_REVISIONS.get(name)

    def hf_kwargs(self, name: str | None = None) -> dict:
        """Keyword arguments for every from_pretrained call (of model `name`: at its pinned revision)."""
        kwargs: dict = {"local_files_only": self.local_files_only}
        if self.cache_dir is not None:
            kwargs["cache_dir"] = str(self.cache_dir)
        if name is not None and self.revision(name) is not None:
            kwargs["revision"] = self.revision(name)
        return kwargs


class ModelsMissing(ConfigError):
    """The models the source needs are neither here nor to be fetched from here: the operator
    must fetch or build them (a restart cannot help, so it is a ConfigError: exit 2, no restart)."""


# The stand-in builder (builders.standins) writes this marker into a stand-in home last, so its
# presence means every model was written; it raises the version whenever the files it writes change.
STANDIN_MARKER = "standins.json"
STANDIN_VERSION = 8


# A model counts as present when its config and at least one weights file are in one snapshot.
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def hub_cache_dir() -> Path:
    """The Hugging Face cache the hub source reads (HF_HOME / HF_HUB_CACHE choose it)."""
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def hub_endpoint() -> str:
    from huggingface_hub import constants
    return constants.ENDPOINT


def model_is_cached(name: str, cache_dir: Path | None = None) -> bool:
    """At its pinned revision (MODEL_REVISIONS), the one a node loads."""
    from huggingface_hub import try_to_load_from_cache
    config = try_to_load_from_cache(name, "config.json", cache_dir=str(cache_dir) if cache_dir else None,
                                    revision=MODEL_REVISIONS.get(name))
    if not isinstance(config, str):
        return False
    return any(p.suffix in WEIGHT_SUFFIXES for p in Path(config).parent.iterdir())


def missing_models(cache_dir: Path | None = None, names: Sequence[str] = ALL_MODELS) -> list[str]:
    """The models in `names` not (completely) in the hub cache `cache_dir` (None: the default one)."""
    return [name for name in names if not model_is_cached(name, cache_dir)]


def served_models(settings: Settings) -> tuple[str, ...]:
    """The hub models a node loads: EMBEDDER_MODEL in the embedder's place (none there when it is a folder)."""
    embedder = settings.embed.model
    swapped = () if Path(embedder).is_dir() else (embedder,)
    return (*swapped, *ALL_MODELS[1:])


def fetch_command(name: str, cache_dir: Path | None = None) -> str:
    """The shell command that puts `name` into the hub cache: huggingface_hub's own CLI
    (`hf download` since 1.0, `huggingface-cli download` before), the one beside this Python
    when it is not the one on PATH (a venv that is not activated); into `cache_dir` if given."""
    into = f" --revision {MODEL_REVISIONS[name]}" if name in MODEL_REVISIONS else ""
    into += f" --cache-dir {cache_dir}" if cache_dir is not None else ""
    here = Path(sys.executable).parent
    for cli, args in (("hf", "download"), ("huggingface-cli", "download")):
        beside = here / cli
        if beside.is_file():
            on_path = shutil.which(cli)
            shown = cli if on_path and Path(on_path).resolve() == beside.resolve() else str(beside)
            return f"{shown} {args} {name}{into}"
    return f"hf download {name}{into}"


def hub_reachable(timeout_s: float = 3.0) -> bool:
    try:
        import requests
        requests.head(hub_endpoint(), timeout=timeout_s)
        return True
    except Exception:  # any failure means "not reachable from here"
        return False


def hub_source(settings: Settings, *, missing: Callable[[], list[str]] | None = None,
               reachable: Callable[[], bool] = hub_reachable) -> ModelSource:
    """The real models; ModelsMissing at once (one line) when some are not cached and cannot be fetched,
    instead of huggingface_hub's minute of retries per file. All cached: the cache alone if the hub is out
    of reach (no retries on each file)."""
    absent = missing() if missing else missing_models(names=served_models(settings))
    online = not settings.models.hf_hub_offline and reachable()  # offline: not even a look
    if absent and not online:
        commands = "; ".join(fetch_command(name) for name in absent)
        raise ModelsMissing(f"MODEL_SOURCE=hub: {len(absent)} of {len(ALL_MODELS)} models are not in the Hugging Face "
                            f"cache {hub_cache_dir()} and {_why_not_online(settings)}: {', '.join(absent)}; fetch "
                            f"them with: {commands} (./run.sh models checks the cache)")
    if absent:
        log.warning("downloading %s from %s into %s", ", ".join(absent), hub_endpoint(), hub_cache_dir())
    elif not online and not settings.models.hf_hub_offline:
        log.warning("the hub (%s) cannot be reached: using the cached models", hub_endpoint())
    return ModelSource("hub", None, not online)


def _why_not_online(settings: Settings) -> str:
    offline = settings.models.hf_hub_offline
    return "HF_HUB_OFFLINE is set" if offline else f"the hub ({hub_endpoint()}) cannot be reached"


def hub_repo_folder(repo_id: str) -> str:
    """A repo's folder in a hub cache (huggingface_hub's layout)."""
    return "models--" + repo_id.replace("/", "--")


def standin_marker(home: Path) -> dict | None:
    try:
        return json.loads((home / STANDIN_MARKER).read_text())
    except (OSError, ValueError):
        return None


def standins_built(home: Path, profile: str, seed: int | None = None) -> bool:
    """A complete build of the current version of `profile` (and `seed`, if given) is in `home`."""
    marker = standin_marker(home)
    if not marker or marker.get("profile") != profile or marker.get("version") != STANDIN_VERSION:
        return False
    if seed is not None and marker.get("seed") != seed:
        return False
    models = marker.get("models", {})
    snapshots = [home / "hub" / hub_repo_folder(m["repo"]) / "snapshots" / m["revision"] for m in models.values()]
    return {m["repo"] for m in models.values()} == set(ALL_MODELS) and \
        all((snapshot / "config.json").is_file() for snapshot in snapshots)


def build_standins_command(settings: Settings) -> str:
    """The command that builds the stand-ins `settings` reads (the builder's own default home unnamed)."""
    profile, home = settings.models.standin_profile, settings.standin_dir
    into = "" if settings.models.standin_home is None else f" --hf-home {home}"
    return f"python -m builders.standins --profile {profile}{into}"


def standin_source(settings: Settings) -> ModelSource:
    """The stand-ins built beforehand; ModelsMissing naming the build command when there are none."""
    return _built_standins(settings, "standin", lambda profile, home: f"no {profile} stand-in models in {home}; "
                                                                      "a serving node does not build them")


def null_source(settings: Settings) -> ModelSource:
    """The null models (pipeline/null_models.py): the stand-ins' tokenizers and configs, no weights read."""
    return _built_standins(settings, "null", lambda profile, home: f"the null models read the {profile} "
                                                                   f"stand-ins' tokenizers, and none are built in {home}")


def _built_standins(settings: Settings, kind: str, missing: Callable[[str, Path], str]) -> ModelSource:
    """A `kind` source over the stand-ins' folder; ModelsMissing saying `missing` and the build command."""
    home, profile = settings.standin_dir, settings.models.standin_profile
    if not standins_built(home, profile):
        raise ModelsMissing(f"MODEL_SOURCE={kind}: {missing(profile, home)}: build them with: "
                            f"{build_standins_command(settings)}")
    return ModelSource(kind, home / "hub", True, profile)


def resolve_model_source(settings: Settings, *, missing: Callable[[], list[str]] | None = None,
                         reachable: Callable[[], bool] = hub_reachable) -> ModelSource:
    choice = settings.models.model_source
    missing = missing or (lambda: missing_models(names=served_models(settings)))
    if choice == "standin":
        source = standin_source(settings)
    elif choice == "null":
        source = null_source(settings)
    elif choice == "hub":
        source = hub_source(settings, missing=missing, reachable=reachable)
    elif not missing():
        source = ModelSource("hub", None, True)
    elif not settings.models.hf_hub_offline and reachable():  # offline: not even a look
        source = ModelSource("hub", None, False)
    elif standins_built(settings.standin_dir, settings.models.standin_profile):
        source = standin_source(settings)
    else:
        raise ModelsMissing(f"MODEL_SOURCE=auto: no models to serve: the real ones are not in the Hugging Face cache "
                            f"{hub_cache_dir()} and {_why_not_online(settings)}, and no "
                            f"{settings.models.standin_profile} stand-ins are built in {settings.standin_dir}; "
                            "`./run.sh models` names the commands that fetch the real ones, or build stand-ins with: "
                            f"{build_standins_command(settings)}")
    announce(source)
    return source


def announce(source: ModelSource) -> None:
    """Loud on purpose: nobody should mistake a stand-in's words for a real answer."""
    if source.is_null:
        log.warning("!" * 72)
        log.warning("MODEL SOURCE: NULL MODELS, A MEASUREMENT MODE: no model computes anything; every answer is a "
                    "fixed placeholder (MODEL_SOURCE=null; /health and /settings say so)")
        log.warning("!" * 72)
    elif source.is_standin:
        log.warning("*" * 72)
        log.warning("MODEL SOURCE: STAND-INS (%s profile, random weights) from %s", source.profile, source.cache_dir)
        log.warning("answers are NOT meaningful; set MODEL_SOURCE=hub on a machine with the real models")
        log.warning("*" * 72)
    else:
        log.info("model source: real models from the Hugging Face hub%s",
                 " (local cache only)" if source.local_files_only else "")
