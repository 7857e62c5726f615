"""The stand-in profiles and the five models they stand in for (the contract's repo names)."""
from __future__ import annotations

from builders.standins.qwen import QWEN_FAITHFUL
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


# Toy sizes; the embedder keeps hidden=EMBED_DIM so its vectors keep the contract's
# dimension (FAISS indexes built with either profile work with the other).
TINY = {
    "embedder": {"hidden": spec.EMBED_DIM, "layers": 2, "heads": 12, "intermediate": 256},
    "encoder": {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64},
    "generator": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128},
}


# Dimensions per profile: "faithful" is the real models' shapes. The embedder's
# hidden size is the contract's embedding dimension in both.
PROFILE_DIMS = {
    "faithful": {"embedder": {**BASE, "hidden": spec.EMBED_DIM}, "encoder": BASE, "generator": QWEN_FAITHFUL},
    "tiny": TINY,
}


def check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"unknown stand-in profile {profile!r}; expected one of {PROFILES}")
