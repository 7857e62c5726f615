"""One stand-in repo in a hub cache: its config.json, its tokenizer files, seeded random weights,
and the hub layout (models--org--name/snapshots/<revision>, refs/main)."""
from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
from typing import Any, Iterator

from builders.standins.bert import (
    PROJECTION_DIR,
    TOXIC_BIAS_PRIOR,
    bert_tokenizer_files,
    projects,
    sentence_transformers_files,
)
from builders.standins.profiles import MODEL_NAMES
from builders.standins.qwen import QWEN_GENERATION_CONFIG, qwen_tokenizer_files
from builders.standins.tokenizing import dumps
from builders.standins.xlmr import xlmr_tokenizer_files
from pipeline.models import STANDIN_VERSION, hub_repo_folder
from pipeline.spec import EMBED_DIM


def repo_files(key: str, hidden: int) -> dict[str, str]:
    """A repo's files besides config.json and the weights: its tokenizer's (the same in every profile,
    so that token counts do not depend on it) and the generator's and embedder's own (`hidden`: the
    model's hidden size)."""
    if key in ("embedder", "toxicity"):
        files = bert_tokenizer_files(30522, 994, False)
    elif key == "sentiment":
        files = bert_tokenizer_files(105879, 99, True)
    elif key == "reranker":
        files = xlmr_tokenizer_files()
    else:
        files = {**qwen_tokenizer_files(), "generation_config.json": dumps(QWEN_GENERATION_CONFIG)}
    return {**files, **sentence_transformers_files(hidden)} if key == "embedder" else files


def _readme(key: str, profile: str, seed: int) -> str:
    return (
        f"# STAND-IN for {MODEL_NAMES[key]} ({profile} profile, seed {seed})\n\n"
        "Written by `builders.standins`. Same architecture, config format and tokenizer class as the\n"
        "real model, but the weights are **seeded random** and the tokenizer was trained on synthetic\n"
        "English. Outputs are meaningless; only shapes, token counts and timings are realistic.\n"
    )


def _revision(profile: str, repo_id: str, seed: int) -> str:
    # Deterministic 40-hex "commit"; changes with anything that changes the files.
    return hashlib.sha1(f"standin:v{STANDIN_VERSION}:{profile}:{seed}:{repo_id}".encode()).hexdigest()


def _model_seed(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:4], "little")


def write_text(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    # save_pretrained draws its own progress bar per model; ours is enough.
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def variance_preserving_(model: Any) -> None:
    """Redraw every Linear weight with std 1/sqrt(fan_in).

    HF's 0.02 init is a *training* starting point: with untrained weights each
    layer's contribution shrinks, so every input gives (almost) the same output
    (tiny classifiers returned identical logits for all texts). A variance-
    preserving scale keeps activations O(1), so outputs vary with the input the
    way a trained model's do. Embeddings not tied to a Linear keep the 0.02 init
    (a LayerNorm/RMSNorm follows them anyway).
    """
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, module.in_features**-0.5)


# The tiny generator's end-of-turn token, its output row scaled by this: with random weights greedy
# decoding never picks it and every answer runs to the 128-token cap, where real answers ("Answer: ...")
# end after a few dozen. Scaled, tiny answers end at varied lengths (2 to 128 tokens over twelve support
# questions, mean about 36; 3 to 52 over the eight client queries), so tests meet both finishes, EOS and
# the cap, and spend less time generating (generation is most of a tiny request's CPU).
# The faithful profile is left as it is: its timings stay comparable with the ledger's.
TINY_END_OF_TURN_SCALE = 3.0


def _build_weights(key: str, snapshot: pathlib.Path, seed: int, dtype: str, profile: str) -> int:
    """Random-init the architecture named in ``snapshot/config.json`` and save it there in ``dtype``."""
    import gc

    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(snapshot)
    model_cls = getattr(transformers, config.architectures[0])
    torch.manual_seed(_model_seed(seed, key))
    # Initialise in fp32 (the usual init path) and only then cast to the checkpoint dtype.
    config.dtype = torch.float32
    model = model_cls(config)
    variance_preserving_(model)
    if key == "toxicity":
        with torch.no_grad():
            model.classifier.bias.copy_(torch.tensor(TOXIC_BIAS_PRIOR))
    if key == "generator" and profile == "tiny":
        end_of_turn = config.eos_token_id if isinstance(config.eos_token_id, int) else config.eos_token_id[0]
        with torch.no_grad():  # the output row (tied: also the input embedding, which only ends a turn)
            model.get_output_embeddings().weight[end_of_turn] *= TINY_END_OF_TURN_SCALE
    model = model.to(getattr(torch, dtype)).eval()
    n_params = sum(p.numel() for p in model.parameters())
    with _quiet_transformers():
        model.save_pretrained(snapshot, safe_serialization=True)
    del model
    gc.collect()
    return n_params


def write_projection(snapshot: pathlib.Path, seed: int, in_features: int) -> None:
    """The tiny embedder's sentence-transformers Dense module (bert.sentence_transformers_files lists
    it): seeded random weights, variance-preserving as the encoder's, from its CLS vector to the
    contract's embedding dimension, no activation."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(_model_seed(seed, "embedder-projection"))
    weight = torch.randn(EMBED_DIM, in_features, generator=generator) * in_features**-0.5
    folder = snapshot / PROJECTION_DIR
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"linear.weight": weight.contiguous(), "linear.bias": torch.zeros(EMBED_DIM)},
              str(folder / "model.safetensors"))
    write_text(folder / "config.json", dumps({"in_features": in_features, "out_features": EMBED_DIM, "bias": True,
                                              "activation_function": "torch.nn.modules.linear.Identity"}))


def build_repo(hub: pathlib.Path, key: str, profile: str, seed: int, config: dict[str, Any]) -> dict[str, Any]:
    repo_id = MODEL_NAMES[key]
    revision = _revision(profile, repo_id, seed)
    repo = hub / hub_repo_folder(repo_id)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    write_text(snapshot / "config.json", dumps(config))
    n_params = _build_weights(key, snapshot, seed, config["torch_dtype"], profile)
    # save_pretrained rewrote these in the installed transformers' format; restore
    # the real repos' files so loading sees what it would see after a download.
    (snapshot / "generation_config.json").unlink(missing_ok=True)
    files = {"config.json": dumps(config), **repo_files(key, config["hidden_size"]), "README.md": _readme(key, profile, seed)}
    if key == "embedder" and projects(config["hidden_size"]):
        write_projection(snapshot, seed, config["hidden_size"])
    for name, text in files.items():
        write_text(snapshot / name, text)
    # No trailing newline: huggingface_hub reads the ref verbatim.
    write_text(repo / "refs" / "main", revision)
    # save_pretrained leaves the weights 0600; a cache may be read by another user.
    for path in repo.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return {"repo": repo_id, "revision": revision, "parameters": n_params}
