"""The reranker's family, XLM-RoBERTa (bge-reranker-base): a SentencePiece-style Unigram tokenizer of
250002 pieces and the XLMRobertaForSequenceClassification config."""
from __future__ import annotations

import collections
import functools
import math
from typing import Any

from builders.standins.bert import bert_config, labels
from builders.standins.tokenizing import EXTRA_ALPHABET, added_token, tokenizer_file_set, train_bpe
from builders.standins.vocabulary import fillers, pseudo_words, training_text

XLMR_VOCAB = 250002
XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0-3; <mask> is the last id
XLMR_IDS = {**{t: i for i, t in enumerate(XLMR_SPECIALS)}, "<mask>": XLMR_VOCAB - 1}
XLMR_TOKENIZER_CONFIG = {
    "added_tokens_decoder": {str(i): added_token(t, lstrip=t == "<mask>") for t, i in XLMR_IDS.items()},
    "bos_token": "<s>",
    "clean_up_tokenization_spaces": True,
    "cls_token": "<s>",
    "eos_token": "</s>",
    "mask_token": "<mask>",
    "model_max_length": 512,
    "pad_token": "<pad>",
    "sep_token": "</s>",
    "sp_model_kwargs": {},
    "tokenizer_class": "XLMRobertaTokenizer",
    "unk_token": "<unk>",
}


def _xlmr_pipeline(tok: Any) -> Any:
    from tokenizers import decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def _xlmr_pieces() -> list[list[Any]]:
    """``[piece, score]`` for all 250002 ids, specials first and <mask> last.

    SentencePiece-style pieces from a (reproducible) BPE run; each piece's score
    is its log-frequency when that BPE segments the corpus, which is what a
    Unigram model's scores estimate.
    """
    from tokenizers import Tokenizer, models

    corpus = training_text()[::2]  # half is plenty and keeps the build fast
    bpe = _xlmr_pipeline(Tokenizer(models.BPE()))
    learned = train_bpe(bpe, corpus, EXTRA_ALPHABET)
    counts = collections.Counter(i for enc in bpe.encode_batch(list(corpus)) for i in enc.ids)
    total = sum(counts.values()) + len(learned)
    # Rounded: full-precision floats double tokenizer.json and its parse time.
    pieces: list[list[Any]] = [[p, 0.0] for p in XLMR_SPECIALS] + [
        [t, round(math.log((counts[i] + 1) / total), 4)] for i, t in enumerate(learned) if t not in XLMR_SPECIALS
    ]
    floor = round(min(s for _, s in pieces[4:]) - 2.0, 1)
    taken = {p for p, _ in pieces} | {"<mask>"}
    pieces += [[f, floor] for f in fillers(XLMR_VOCAB - 1 - len(pieces), lambda i, w: "▁" + w, taken, pseudo_words)]
    pieces.append(["<mask>", 0.0])
    assert len(pieces) == XLMR_VOCAB
    return pieces


@functools.lru_cache(maxsize=None)
def xlmr_tokenizer_files() -> dict[str, str]:
    """SentencePiece-style Unigram: <s>=0 <pad>=1 </s>=2 <unk>=3 ... <mask>=250001."""
    from tokenizers import AddedToken, Tokenizer, models, processors

    pieces = _xlmr_pieces()
    tok = _xlmr_pipeline(Tokenizer(models.Unigram([tuple(p) for p in pieces], unk_id=3, byte_fallback=False)))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in XLMR_SPECIALS]
        + [AddedToken("<mask>", special=True, normalized=False, lstrip=True)]
    )
    return tokenizer_file_set(tok, XLMR_TOKENIZER_CONFIG)


def reranker_config(dims: dict[str, int]) -> dict[str, Any]:
    # bge-reranker-base is an XLM-RoBERTa cross-encoder with one logit.
    return bert_config(
        XLMR_VOCAB,
        dims,
        architectures=["XLMRobertaForSequenceClassification"],
        model_type="xlm-roberta",
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
        layer_norm_eps=1e-05,
        max_position_embeddings=514,
        type_vocab_size=1,
        output_past=True,
        **labels(["LABEL_0"]),
    )
