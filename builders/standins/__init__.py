"""Offline stand-ins for the five Hugging Face models the service uses, one module per model family.

The real checkpoints cannot be downloaded here, so this package writes look-alikes
into a Hugging Face hub cache: same repo names, same architectures, same config
fields, same tokenizer classes and special-token ids, but *seeded random
weights*. With ``HF_HOME=<home>`` and ``HF_HUB_OFFLINE=1`` the unchanged
production loading code (``SentenceTransformer(name)``,
``AutoModel*.from_pretrained(name)``, ``pipeline(..., model=name)``) picks them
up from the cache exactly as it would pick up the real downloads.

Two profiles:

* ``faithful``: real shapes and vocab sizes, so compute, memory and disk cost
  match the real models (useful for profiling and capacity planning).
* ``tiny``: the same classes/tokenizers/labels with toy dimensions, built in
  seconds, for tests and CI. The embedder still emits 768-d vectors so FAISS
  indexes are interchangeable between profiles.

Outputs are meaningless (random weights): retrieval order, reranker scores,
sentiment and generated text are noise. Only shapes, dtypes, token counts and
timings are realistic.

The families: ``bert`` (embedder, toxicity, sentiment), ``xlmr`` (reranker), ``qwen``
(generator), over ``vocabulary`` (the synthetic training text) and ``tokenizing``
(what the tokenizers share); ``repos`` writes one model's repo, ``build`` all five.

CLI: ``python -m builders.standins --profile {tiny,faithful} [--hf-home DIR] [--seed N] [--force]``
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
