"""The BERT family (the bge-base embedder, toxic-bert, nlptown's sentiment model): uncased WordPiece
tokenizers laid out like bert-base-uncased, their config.json, and the embedder's
sentence-transformers files."""
from __future__ import annotations

import functools
from typing import Any

from builders.standins.tokenizing import EXTRA_ALPHABET, added_token, dumps, tokenizer_file_set, train_bpe
from builders.standins.vocabulary import fillers, training_text
from pipeline import spec

BERT_SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
BERT_TOKENIZER_CONFIG = {
    "added_tokens_decoder": {str(i): added_token(t) for t, i in BERT_SPECIALS.items()},
    "clean_up_tokenization_spaces": True,
    "cls_token": "[CLS]",
    "do_basic_tokenize": True,
    "do_lower_case": True,
    "mask_token": "[MASK]",
    "model_max_length": 512,
    "never_split": None,
    "pad_token": "[PAD]",
    "sep_token": "[SEP]",
    "strip_accents": None,
    "tokenize_chinese_chars": True,
    "tokenizer_class": "BertTokenizer",
    "unk_token": "[UNK]",
}


def _bert_pipeline(tok: Any) -> Any:
    from tokenizers import decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _bert_vocab_tokens(vocab_size: int, n_unused: int, multilingual: bool) -> list[str]:
    """Token list laid out like bert-base-uncased: [PAD]=0, [unusedN], [UNK]=100,
    [CLS]=101, [SEP]=102, [MASK]=103, then the learned vocabulary, padded to ``vocab_size``."""
    from tokenizers import Tokenizer, models

    corpus = training_text() if multilingual else tuple(line for line in training_text() if line.isascii())
    alphabet = [c for c in EXTRA_ALPHABET if c.lower() == c]
    # Every BPE piece serves both word-initially and as a "##" continuation.
    learned = [form for t in train_bpe(_bert_pipeline(Tokenizer(models.BPE())), corpus, alphabet) for form in (t, "##" + t)]

    # Layout of the real uncased BERT vocabularies: unused slots around the specials.
    tokens: list[str] = ["[PAD]"] + [f"[unused{i}]" for i in range(99)]
    tokens += ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [f"[unused{i}]" for i in range(99, n_unused)]
    taken = set(tokens)
    for t in learned:
        if t not in taken:
            taken.add(t)
            tokens.append(t)
    # Whole-word fillers (some as ## continuations) up to the model's vocab size.
    tokens += fillers(vocab_size - len(tokens), lambda i, w: w if i % 5 else "##" + w, taken)
    assert len(tokens) == vocab_size
    return tokens


@functools.lru_cache(maxsize=None)
def bert_tokenizer_files(vocab_size: int, n_unused: int, multilingual: bool) -> dict[str, str]:
    """Uncased WordPiece laid out like bert-base-uncased (see :func:`_bert_vocab_tokens`)."""
    from tokenizers import AddedToken, Tokenizer, models, processors

    tokens = _bert_vocab_tokens(vocab_size, n_unused, multilingual)
    vocab = {t: i for i, t in enumerate(tokens)}
    assert all(vocab[k] == v for k, v in BERT_SPECIALS.items())
    tok = _bert_pipeline(Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100)))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 101), ("[SEP]", 102)],
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BERT_SPECIALS])
    return tokenizer_file_set(tok, BERT_TOKENIZER_CONFIG, {"vocab.txt": "\n".join(tokens) + "\n"})


def bert_config(vocab_size: int, dims: dict[str, int], **extra: Any) -> dict[str, Any]:
    cfg = {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "classifier_dropout": None,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": dims["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": dims["intermediate"],
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "model_type": "bert",
        "num_attention_heads": dims["heads"],
        "num_hidden_layers": dims["layers"],
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "transformers_version": "4.30.0",
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    cfg.update(extra)
    return dict(sorted(cfg.items()))


def labels(names: list[str]) -> dict[str, Any]:
    return {
        "id2label": {str(i): n for i, n in enumerate(names)},
        "label2id": {n: i for i, n in enumerate(names)},
    }


# The folder of the tiny embedder's projection to the contract's embedding dimension.
PROJECTION_DIR = "2_Dense"


def projects(hidden: int) -> bool:
    """Whether an embedder this wide gets the Dense projection to the contract's embedding dimension."""
    return hidden != spec.EMBED_DIM

TOXIC_LABELS = ["toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"]
# Output-bias priors for the random toxicity head: roughly the real model's
# base rates on benign text, so a stand-in does not flag half of all messages
# as toxic (the weights themselves stay random).
TOXIC_BIAS_PRIOR = [-3.0, -6.0, -4.5, -6.5, -4.5, -6.0]


def embedder_config(dims: dict[str, int]) -> dict[str, Any]:
    return bert_config(30522, dims, **labels(["LABEL_0"]))


def toxicity_config(dims: dict[str, int]) -> dict[str, Any]:
    return bert_config(
        30522,
        dims,
        architectures=["BertForSequenceClassification"],
        problem_type="multi_label_classification",
        **labels(TOXIC_LABELS),
    )


def sentiment_config(dims: dict[str, int]) -> dict[str, Any]:
    # nlptown's config carries the old pooler_* fields; kept so the file reads like the real one.
    return bert_config(
        105879,
        dims,
        architectures=["BertForSequenceClassification"],
        _num_labels=5,
        directionality="bidi",
        finetuning_task="sentiment-analysis",
        output_past=True,
        pooler_fc_size=768,
        pooler_num_attention_heads=12,
        pooler_num_fc_layers=3,
        pooler_size_per_head=128,
        pooler_type="first_token_transform",
        **labels(list(spec.STAR_LABELS)),  # id order = star order, as in the real config
    )


def sentence_transformers_files(hidden: int) -> dict[str, str]:
    """bge-base-en-v1.5's sentence-transformers layout: Transformer -> CLS pooling -> Normalize; an
    encoder narrower than the contract's embedding dimension gets a Dense projection to it before
    Normalize (its weights: :func:`builders.standins.repos.write_projection`)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if projects(hidden):
        modules.append({"idx": 2, "name": "2", "path": PROJECTION_DIR, "type": "sentence_transformers.models.Dense"})
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
    pooling = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    return {
        "modules.json": dumps(modules),
        "sentence_bert_config.json": dumps({"max_seq_length": 512, "do_lower_case": True}),
        "config_sentence_transformers.json": dumps(
            {"__version__": {"sentence_transformers": "2.2.2", "transformers": "4.28.1", "pytorch": "1.13.0+cu117"}}
        ),
        "1_Pooling/config.json": dumps(pooling),
    }
