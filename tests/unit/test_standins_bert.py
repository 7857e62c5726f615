"""builders/standins/bert.py and profiles.py: the embedder's sentence-transformers layout per profile."""
import json

from builders.standins.bert import PROJECTION_DIR, sentence_transformers_files
from builders.standins.profiles import model_configs
from pipeline import spec


def modules(files: dict[str, str]) -> list[tuple[str, str]]:
    return [(m["path"], m["type"].rsplit(".", 1)[-1]) for m in json.loads(files["modules.json"])]


def test_an_embedder_as_wide_as_the_contract_has_bge_bases_layout():
    files = sentence_transformers_files(spec.EMBED_DIM)
    assert modules(files) == [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
    assert json.loads(files["1_Pooling/config.json"])["word_embedding_dimension"] == spec.EMBED_DIM


def test_a_narrower_embedder_is_projected_to_the_contracts_dimension_before_normalizing():
    files = sentence_transformers_files(32)
    assert modules(files) == [("", "Transformer"), ("1_Pooling", "Pooling"), (PROJECTION_DIR, "Dense"),
                              ("3_Normalize", "Normalize")]
    assert json.loads(files["1_Pooling/config.json"])["word_embedding_dimension"] == 32


def test_the_faithful_embedder_is_bge_base_wide_and_the_tiny_one_as_narrow_as_the_other_encoders():
    faithful, tiny = model_configs("faithful"), model_configs("tiny")
    assert faithful["embedder"]["hidden_size"] == spec.EMBED_DIM
    assert tiny["embedder"]["hidden_size"] == tiny["toxicity"]["hidden_size"] < spec.EMBED_DIM
