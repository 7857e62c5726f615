"""Offline stand-ins for the five Hugging Face models the service uses, one module per model family.

The real checkpoints cannot be downloaded here, so this package writes look-alikes into a Hugging
Face hub cache: the same repo names, architectures, config fields, tokenizer classes and
special-token ids, but *seeded random weights*, so outputs are noise and only shapes, dtypes,
token counts and timings are realistic. With ``HF_HOME=<home>`` and ``HF_HUB_OFFLINE=1`` the
unchanged production loading code picks them up as it would the real downloads.

Profiles: ``faithful`` (the real shapes and vocab sizes, for profiling and capacity planning) and
``tiny`` (toy dimensions, built in seconds, for tests and CI; the embedder still emits 768-d
vectors, through a Dense projection after its pooling, so FAISS indexes work with either profile).

The families: ``bert`` (embedder, toxicity, sentiment), ``xlmr`` (reranker), ``qwen`` (generator),
over ``vocabulary`` (the synthetic training text) and ``tokenizing`` (what the tokenizers share);
``repos`` writes one model's repo, ``build`` all five, ``cli`` is ``python -m builders.standins``.
"""
from builders.standins.build import (
    build_standins,
    default_standin_home,
    is_built,
    read_marker,
    source_building_standins,
    standin_env,
)
from builders.standins.cli import main
from builders.standins.profiles import MODEL_NAMES, PROFILES
from pipeline.models import STANDIN_VERSION

__all__ = ["PROFILES", "MODEL_NAMES", "STANDIN_VERSION", "default_standin_home", "is_built", "build_standins",
           "standin_env", "read_marker", "source_building_standins", "main"]
