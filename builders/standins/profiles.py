"""The stand-in profiles and the five models they stand in for: the contract's repo names, and each
model's config.json per profile."""
from __future__ import annotations

from typing import Any

from builders.standins.bert import embedder_config, sentiment_config, toxicity_config
from builders.standins.qwen import QWEN_FAITHFUL, qwen_config
from builders.standins.xlmr import reranker_config
from pipeline import spec

PROFILES = ("tiny", "faithful")
# Build order and marker keys; the repo names are the contract's.
MODEL_NAMES = {
    "embedder": spec.EMBEDDER_MODEL,
    "reranker": spec.RERANKER_MODEL,
    "generator": spec.GENERATOR_MODEL,
    "sentiment": spec.SENTIMENT_MODEL,
    "toxicity": spec.TOXICITY_MODEL,
}

BASE = {"hidden": 768, "layers": 12, "heads": 12, "intermediate": 3072}  # bert-base
# Dimensions per profile: "faithful" is the real models' shapes, "tiny" toy sizes. The embedder's
# output is the contract's embedding dimension in both (FAISS indexes built with either profile work
# with the other): the faithful one's hidden size is that dimension, as bge-base's; the tiny one's is
# an encoder's toy size, and a sentence-transformers Dense layer projects its CLS vector to it (a
# 768-wide tiny encoder made embedding most of the test suite's model CPU).
PROFILE_DIMS = {
    "faithful": {"embedder": {**BASE, "hidden": spec.EMBED_DIM}, "encoder": BASE, "generator": QWEN_FAITHFUL},
    "tiny": {
        "embedder": {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64},
        "encoder": {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64},
        "generator": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128},
    },
}


def check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"unknown stand-in profile {profile!r}; expected one of {PROFILES}")


def model_configs(profile: str) -> dict[str, dict[str, Any]]:
    """The config.json of each of the five models in ``profile``."""
    dims = PROFILE_DIMS[profile]
    return {
        "embedder": embedder_config(dims["embedder"]),
        "reranker": reranker_config(dims["encoder"]),
        "generator": qwen_config(dims["generator"], faithful=profile == "faithful"),
        "sentiment": sentiment_config(dims["encoder"]),
        "toxicity": toxicity_config(dims["encoder"]),
    }
