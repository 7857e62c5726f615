"""Tests for builders.standins (tiny profile only).

The stand-ins are built once per session into a temp dir. The loading checks
run in a subprocess: huggingface_hub reads HF_HOME / HF_HUB_OFFLINE when it is
imported, so setting them inside this (already importing) process is not
reliable.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from builders import standins
from builders.standins import build as standins_build

pytestmark = pytest.mark.slow

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# Support-style English for the chars/token check (written fresh, not taken
# from the generator's training templates).
SUPPORT_SENTENCES = [
    "Hello, my package was supposed to arrive on Tuesday but the tracking page still says label created.",
    "I returned the blue sweater two weeks ago and still haven't seen the refund on my card.",
    "Can you help me change the email address on my account? I no longer have access to the old one.",
    "The charger that came with my tablet stopped working after three days. Is that covered by the warranty?",
    "Why was I billed twice for my monthly subscription in March? Please fix this as soon as possible.",
]

# Runs with HF_HOME=<tiny home> and HF_HUB_OFFLINE=1, using exactly the
# production loading calls, and prints one JSON report on its last line.
# It imports first and then waits for "go" on stdin (see session_builds).
CHECK_SCRIPT = r"""
import json, sys
import numpy as np
import torch
from huggingface_hub import constants, try_to_load_from_cache
from sentence_transformers import SentenceTransformer
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, pipeline
import transformers.models.bert.modeling_bert, transformers.models.xlm_roberta.modeling_xlm_roberta
import transformers.models.qwen2.modeling_qwen2

sys.stdin.readline()  # imports done; wait until the parent has finished building
sentences = json.loads(sys.argv[1])
r = {"offline": constants.HF_HUB_OFFLINE, "hf_home": constants.HF_HOME, "cached": {}}
for name in json.loads(sys.argv[2]):
    r["cached"][name] = try_to_load_from_cache(name, "config.json")

def chars_per_token(tok):
    n = sum(len(tok(s, add_special_tokens=False)["input_ids"]) for s in sentences)
    return sum(map(len, sentences)) / n

st = SentenceTransformer("BAAI/bge-base-en-v1.5")
emb = st.encode(["Where is my order?", "How do I reset my password?", "refund policy"], normalize_embeddings=True)
r["embedder"] = {"shape": list(emb.shape), "dtype": str(emb.dtype),
                 "norms": np.linalg.norm(emb, axis=1).tolist(), "max_seq_length": st.max_seq_length,
                 "modules": [type(m).__name__ for m in st]}

rt = AutoTokenizer.from_pretrained("BAAI/bge-reranker-base")
rm = AutoModelForSequenceClassification.from_pretrained("BAAI/bge-reranker-base").eval()
pairs = [["where is my order", "Orders ship within 2 business days."],
         ["where is my order", "Refunds take 5 days."],
         ["reset password", "Click 'Forgot password' on the sign-in page."]]
with torch.inference_mode():
    logits = rm(**rt(pairs, padding=True, truncation=True, max_length=512, return_tensors="pt")).logits
r["reranker"] = {"class": type(rt).__name__, "fast": rt.is_fast, "logits_shape": list(logits.shape),
                 "ids": [rt.bos_token_id, rt.pad_token_id, rt.eos_token_id, rt.unk_token_id, rt.mask_token_id],
                 "len": len(rt), "num_labels": rm.config.num_labels, "vocab": rm.config.vocab_size,
                 "max_pos": rm.config.max_position_embeddings}

qt = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
qm = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct").eval()
prompt = qt.apply_chat_template([{"role": "user", "content": "Where is my refund?"}], tokenize=False,
                                add_generation_prompt=True)
prompt_sys = qt.apply_chat_template([{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
inputs = qt(prompt, return_tensors="pt")
torch.manual_seed(0)
with torch.inference_mode():
    out = qm.generate(**inputs, max_new_tokens=8)
new = out[0, inputs["input_ids"].shape[1]:]
gc = qm.generation_config
r["generator"] = {
    "class": type(qt).__name__, "fast": qt.is_fast, "prompt": prompt, "prompt_sys": prompt_sys,
    "special_ids": qt.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    "prompt_ids_head": inputs["input_ids"][0][:1].tolist(),
    "pad": [qt.pad_token, qt.pad_token_id], "eos": [qt.eos_token, qt.eos_token_id], "len": len(qt),
    "vocab": qm.config.vocab_size, "tied": qm.config.tie_word_embeddings, "dtype": str(qm.dtype),
    "new_tokens": len(new), "text": qt.decode(new, skip_special_tokens=True),
    "gen": {"bos": gc.bos_token_id, "eos": gc.eos_token_id, "pad": gc.pad_token_id, "rep": gc.repetition_penalty,
            "do_sample": gc.do_sample, "temperature": gc.temperature, "top_p": gc.top_p, "top_k": gc.top_k},
    "decode_all_ids_nonempty": sum(bool(qt.decode([i])) for i in range(0, 151643, 97)) / len(range(0, 151643, 97)),
}

sent = pipeline("text-classification", model="nlptown/bert-base-multilingual-uncased-sentiment")
sent_all = sent(["Great product, fast delivery!", "Terrible service."], top_k=None)
r["sentiment"] = {"class": type(sent.tokenizer).__name__, "fast": sent.tokenizer.is_fast,
                  "top": [d["label"] for d in sent(["Great product, fast delivery!"])],
                  "labels": sorted(d["label"] for d in sent_all[0]),
                  "score_sum": sum(d["score"] for d in sent_all[0]), "vocab": sent.model.config.vocab_size,
                  "len": len(sent.tokenizer)}

tox = pipeline("text-classification", model="unitary/toxic-bert", top_k=None)
tox_out = tox(["You are useless.", "Thanks, that solved it!"])
r["toxicity"] = {"class": type(tox.tokenizer).__name__, "fast": tox.tokenizer.is_fast,
                 "labels": [sorted(d["label"] for d in row) for row in tox_out],
                 "scores": [{d["label"]: d["score"] for d in row} for row in tox_out],
                 "problem_type": tox.model.config.problem_type}

bt = AutoTokenizer.from_pretrained("BAAI/bge-base-en-v1.5")
r["bert_ids"] = [bt.pad_token_id, bt.unk_token_id, bt.cls_token_id, bt.sep_token_id, bt.mask_token_id]
r["bert_class"] = [type(bt).__name__, bt.is_fast, len(bt)]
r["chars_per_token"] = {"qwen": chars_per_token(qt), "bert": chars_per_token(bt),
                        "mbert": chars_per_token(sent.tokenizer), "xlmr": chars_per_token(rt)}
print(json.dumps(r))
"""


def _hash_tree(root: pathlib.Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="session")
def session_builds(tmp_path_factory) -> dict:
    """Build the tiny stand-ins once, run the offline loading checks in a
    subprocess, and make a second same-seed build for the determinism test.

    To keep this file fast the work overlaps: the child imports torch /
    transformers / sentence-transformers while the first build runs (its
    HF_HOME is known up front) and waits for a line on stdin before loading;
    the second build runs while the child loads.
    """
    root = tmp_path_factory.mktemp("standins")
    home = root / "tiny"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(standins.standin_env(home))
    env.update({"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"})
    argv = [sys.executable, "-c", CHECK_SCRIPT, json.dumps(SUPPORT_SENTENCES), json.dumps(list(standins.MODEL_NAMES.values()))]
    # Files, not pipes: nobody reads the child's output until the end.
    with open(root / "check.out", "w+") as out, open(root / "check.err", "w+") as err:
        proc = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=out, stderr=err, text=True)
        try:
            assert not standins.is_built(home, "tiny")
            built = standins.build_standins("tiny", home, seed=0, progress=False)
            proc.stdin.write("go\n")
            proc.stdin.close()
            again = standins.build_standins("tiny", root / "again", seed=0, progress=False)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        assert proc.returncode == 0, err.read()[-5000:]
        report = json.loads(out.read().strip().splitlines()[-1])
    return {"home": built, "again": again, "report": report}


@pytest.fixture(scope="session")
def tiny_home(session_builds) -> pathlib.Path:
    return session_builds["home"]


@pytest.fixture(scope="session")
def report(session_builds) -> dict:
    return session_builds["report"]


def test_loads_offline_from_the_standin_cache(report, tiny_home):
    assert report["offline"] is True
    for name, path in report["cached"].items():
        assert isinstance(path, str) and pathlib.Path(path).is_relative_to(tiny_home.absolute()), (name, path)


def test_embedder_gives_unit_norm_768d_float32(report):
    emb = report["embedder"]
    assert emb["shape"] == [3, 768]
    assert emb["dtype"] == "float32"
    assert all(abs(n - 1.0) < 1e-4 for n in emb["norms"])
    assert emb["max_seq_length"] == 512
    # The tiny encoder is 32 wide: a Dense layer projects its CLS vector to the contract's 768.
    assert emb["modules"] == ["Transformer", "Pooling", "Dense", "Normalize"]


def test_reranker_gives_one_logit_per_pair(report):
    rr = report["reranker"]
    assert rr["logits_shape"] == [3, 1]
    assert rr["class"].startswith("XLMRobertaTokenizer") and rr["fast"]
    assert rr["ids"] == [0, 1, 2, 3, 250001]
    assert rr["len"] == rr["vocab"] == 250002
    assert rr["num_labels"] == 1 and rr["max_pos"] == 514


def test_qwen_chat_template_and_special_tokens(report):
    g = report["generator"]
    assert g["class"].startswith("Qwen2Tokenizer") and g["fast"]
    assert g["prompt"] == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhere is my refund?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert g["prompt_sys"] == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert g["special_ids"] == [151643, 151644, 151645]
    assert g["prompt_ids_head"] == [151644]  # <|im_start|> is one token, no BOS added
    assert g["pad"] == ["<|endoftext|>", 151643]
    assert g["eos"] == ["<|im_end|>", 151645]
    assert g["len"] == 151665 and g["vocab"] == 151936 and g["tied"] is True
    assert g["dtype"] == "torch.bfloat16"
    assert g["gen"] == {"bos": 151643, "eos": [151645, 151643], "pad": 151643, "rep": 1.1,
                        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}


def test_qwen_generates_visible_text(report):
    g = report["generator"]
    assert g["new_tokens"] == 8
    assert g["text"].strip()
    # Filler vocab: ids across the whole regular range decode to text.
    assert g["decode_all_ids_nonempty"] == 1.0


def test_classifiers_label_sets(report):
    s = report["sentiment"]
    stars = ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"]
    assert s["labels"] == stars and s["top"][0] in stars
    assert abs(s["score_sum"] - 1.0) < 1e-4  # softmax over five stars
    assert s["vocab"] == s["len"] == 105879
    assert s["class"].startswith("BertTokenizer") and s["fast"]

    t = report["toxicity"]
    six = sorted(["toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"])
    assert t["labels"] == [six, six]
    assert t["problem_type"] == "multi_label_classification"
    for scores in t["scores"]:
        assert all(0.0 < v < 1.0 for v in scores.values())
        assert abs(sum(scores.values()) - 1.0) > 1e-3  # independent sigmoids, not a softmax
        assert max(scores.values()) < 0.5  # the bias prior keeps benign text un-flagged
    assert t["class"].startswith("BertTokenizer") and t["fast"]


def test_bert_special_token_layout(report):
    assert report["bert_ids"] == [0, 100, 101, 102, 103]
    cls_name, fast, size = report["bert_class"]
    assert cls_name.startswith("BertTokenizer") and fast and size == 30522


def test_english_token_counts_are_realistic(report):
    cpt = report["chars_per_token"]
    for name in ("qwen", "bert", "mbert"):
        assert 3.0 <= cpt[name] <= 6.0, cpt


def test_in_process_cache_dir_loading(tiny_home):
    # The services pass cache_dir=<home>/hub + local_files_only instead of HF_HOME.
    from transformers import AutoConfig, AutoTokenizer

    kwargs = {"cache_dir": str(tiny_home / "hub"), "local_files_only": True}
    cfg = AutoConfig.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct", **kwargs)
    assert (cfg.vocab_size, cfg.num_key_value_heads) == (151936, 2)
    tok = AutoTokenizer.from_pretrained("unitary/toxic-bert", **kwargs)
    assert tok("refund")["input_ids"][0] == 101


def test_marker_and_is_built(tiny_home):
    marker = standins.read_marker(tiny_home)
    assert marker["profile"] == "tiny" and marker["seed"] == 0 and marker["version"] == standins.STANDIN_VERSION
    assert {m["repo"] for m in marker["models"].values()} == set(standins.MODEL_NAMES.values())
    assert standins.is_built(tiny_home, "tiny")
    assert standins.is_built(tiny_home, "tiny", seed=0)
    assert not standins.is_built(tiny_home, "tiny", seed=1)
    assert not standins.is_built(tiny_home, "faithful")
    with pytest.raises(ValueError):
        standins.is_built(tiny_home, "huge")
    with pytest.raises(ValueError):
        standins.default_standin_home("huge")
    assert standins.default_standin_home("tiny") == REPO_ROOT / ".cache" / "standins" / "tiny"


def test_second_build_is_fast_and_changes_nothing(tiny_home, capsys):
    before = {p: p.stat().st_mtime_ns for p in tiny_home.rglob("*") if p.is_file()}
    started = time.perf_counter()
    assert standins.build_standins("tiny", tiny_home, seed=0, progress=False) == tiny_home.absolute()
    assert time.perf_counter() - started < 1.0
    assert standins.main(["--profile", "tiny", "--hf-home", str(tiny_home), "--quiet"]) == 0
    assert "already built" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in tiny_home.rglob("*") if p.is_file()} == before


def test_same_seed_gives_identical_files(tiny_home, session_builds):
    a, b = _hash_tree(tiny_home / "hub"), _hash_tree(session_builds["again"] / "hub")
    assert a == b
    # Five models and the tiny embedder's projection (its Dense layer).
    assert sum(name.endswith("model.safetensors") for name in a) == 6
    assert sum(name.endswith("2_Dense/model.safetensors") for name in a) == 1


def test_interrupted_build_never_looks_complete(tmp_path, monkeypatch):
    real = standins_build.build_repo

    def failing(hub, key, *args, **kwargs):
        if key == "reranker":
            raise KeyboardInterrupt("simulated interruption")
        return real(hub, key, *args, **kwargs)

    monkeypatch.setattr(standins_build, "build_repo", failing)
    home = tmp_path / "broken"
    with pytest.raises(KeyboardInterrupt):
        standins.build_standins("tiny", home, progress=False)
    assert not standins.is_built(home, "tiny")
    assert not home.exists()
    assert not list(tmp_path.glob(".broken.building-*"))
