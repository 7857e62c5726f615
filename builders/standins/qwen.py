"""The generator's family, Qwen2.5: a byte-level BPE tokenizer laid out like Qwen2's (151643 regular
entries, the same added tokens and chat template) and the Qwen2ForCausalLM config."""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from builders.standins.tokenizing import added_token, byte_level, tokenizer_file_set, train_bpe_model
from builders.standins.vocabulary import fillers, training_text

QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_REGULAR_VOCAB = 151643  # ids 0..151642 are BPE tokens; specials start at 151643
# Qwen2.5's added tokens, ids 151643 on in this order, exactly as in its tokenizer_config.json:
# the first 14 are special, and none is normalized (each is matched in the text as typed).
_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
QWEN_ADDED_TOKENS = tuple((QWEN_REGULAR_VOCAB + i, content, i < 14) for i, content in enumerate(_ADDED))

# The Qwen2.5-Instruct chat template (ChatML + Hermes-style tools), including the
# default system prompt injected when the conversation has none.
QWEN_CHAT_TEMPLATE = (resources.files(__package__) / "qwen_chat_template.jinja").read_text(encoding="utf-8")


QWEN_TOKENIZER_CONFIG = {
    "add_bos_token": False,
    "add_prefix_space": False,
    "added_tokens_decoder": {str(t): added_token(c, s, normalized=False) for t, c, s in QWEN_ADDED_TOKENS},
    "additional_special_tokens": [c for tid, c, s in QWEN_ADDED_TOKENS if s and tid != 151643],
    "bos_token": None,
    "chat_template": QWEN_CHAT_TEMPLATE,
    "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>",
    "errors": "replace",
    "model_max_length": 131072,
    "pad_token": "<|endoftext|>",
    "split_special_tokens": False,
    "tokenizer_class": "Qwen2Tokenizer",
    "unk_token": None,
}


def _qwen_pipeline(tok: Any) -> Any:
    """Qwen2's normalizer, pre-tokenizer (split regex, then bytes) and byte-level decoder."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def _qwen_filler(i: int, word: str) -> str:
    # Mostly space-prefixed lower case, some capitalised, some word-internal: like a real BPE vocab.
    r = i % 10
    if r < 7:
        return byte_level(" " + word)
    if r < 9:
        return byte_level(" " + word.capitalize())
    return byte_level(word)


def _qwen_vocab() -> tuple[dict[str, int], list[list[str]]]:
    """The trained BPE vocab padded to exactly 151643 regular entries, and its merges."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    trained = train_bpe_model(_qwen_pipeline(Tokenizer(models.BPE())), training_text(), pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = dict(trained["vocab"])
    # Fillers: decode-only entries (no merge produces them) so any id a random
    # model samples turns into visible, word-like text.
    for tok in fillers(QWEN_REGULAR_VOCAB - len(vocab), _qwen_filler, set(vocab)):
        vocab[tok] = len(vocab)
    assert len(vocab) == QWEN_REGULAR_VOCAB and max(vocab.values()) == QWEN_REGULAR_VOCAB - 1
    return vocab, trained["merges"]


@functools.lru_cache(maxsize=None)
def qwen_tokenizer_files() -> dict[str, str]:
    """Byte-level BPE with Qwen2's pre-tokenizer; vocab padded to exactly 151643 entries."""
    from tokenizers import AddedToken, Tokenizer, models

    vocab, merges = _qwen_vocab()
    bpe = models.BPE(
        vocab=vocab,
        merges=[tuple(pair) for pair in merges],  # tokenizers >= 0.20 writes merges as pairs
        dropout=None,
        unk_token=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
    )
    tok = _qwen_pipeline(Tokenizer(bpe))
    tok.add_tokens([AddedToken(c, special=s, normalized=False) for _, c, s in QWEN_ADDED_TOKENS])
    for tid, content, _ in QWEN_ADDED_TOKENS:
        assert tok.token_to_id(content) == tid, (content, tok.token_to_id(content), tid)
    vocab_files = {
        "vocab.json": json.dumps(vocab, ensure_ascii=False, separators=(",", ":")),
        "merges.txt": "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
    }
    return tokenizer_file_set(tok, QWEN_TOKENIZER_CONFIG, vocab_files, special_map=False)


QWEN_FAITHFUL = {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate": 4864}


QWEN_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "repetition_penalty": 1.1,
    "temperature": 0.7,
    "top_k": 20,
    "top_p": 0.8,
    "transformers_version": "4.37.0",
}


def qwen_config(gen: dict[str, int], faithful: bool) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": gen["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": gen["intermediate"],
        "max_position_embeddings": 32768,
        "max_window_layers": 21 if faithful else gen["layers"],
        "model_type": "qwen2",
        "num_attention_heads": gen["heads"],
        "num_hidden_layers": gen["layers"],
        "num_key_value_heads": gen["kv_heads"],
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }
