"""profiling.roofline: counts checked by hand and against torch's own FLOP counter on real model
classes, floors as the max of the two bounds, batched decode reading weights once per step, and
the CLI end to end on the tiny stand-ins."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch

from profiling import roofline as tool
from profiling.lib.machine_peaks import Machine, matmul_peak, measure_machine
from profiling.lib.roofline import (
    DecoderShape,
    EncoderShape,
    Models,
    RequestTokens,
    Work,
    bytes_read,
    compare,
    floor_of,
    floor_of_passes,
    plan_floor,
    row_works,
    together,
)
from tests.helpers import TEST_ENV

# Toy shapes small enough to count by hand.
ENCODER = EncoderShape(hidden=4, layers=2, heads=2, intermediate=8, vocab=10, labels=3)
DECODER = DecoderShape(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=20)


def machine(float32=1e9, bfloat16=2e9, int8=4e9, bandwidth=1e9) -> Machine:
    return Machine("test CPU", (), "DEFAULT", 1, {"float32": float32, "bfloat16": bfloat16, "int8": int8},
                   bandwidth, bandwidth)


def linear_weights(model: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def counted_flops(run) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


# ------------------------------------------------------------------------- by hand

def test_encoder_counts_by_hand():
    # Per layer: Q, K, V, O 4 x 4x4 = 64, MLP 4x8 + 8x4 = 64 -> 128; head: pooler 4x4 + 4x3 labels = 28.
    assert ENCODER.layer_weights == 128 and ENCODER.head_weights == 28
    work = ENCODER.forward(5)
    assert work == Work(linear_macs=5 * 2 * 128 + 28,  # every token through each layer, the head on one token
                        attention_macs=2 * 2 * 25 * 4,  # layers x (QK^T + PV) x 5x5 scores x 4 dims
                        weights=2 * 128 + 28, embedding_reads=3 * 5 * 4)


def test_decoder_counts_by_hand():
    # Q, O: 8x8 each; K, V: 8x4 each (one KV head of 4); MLP 3 x 8x16.
    assert DECODER.layer_weights == 128 + 64 + 384
    assert DECODER.weights == 2 * 576 + 20 * 8  # plus the output head
    prefill = DECODER.prefill(3)
    assert prefill.linear_macs == 3 * 2 * 576 + 160  # logits of the last token only
    # Causal: query i sees i keys (1 + 2 + 3 = 6), x 4 dims x 2 heads x 2 layers, QK^T and PV.
    assert prefill.attention_macs == 6 * 4 * 2 * 2 * 2
    assert (prefill.kv_reads, prefill.embedding_reads) == (0, 3 * 8)
    step = DECODER.step(5)
    assert step == Work(linear_macs=1312, attention_macs=5 * 4 * 2 * 2 * 2, weights=1312, embedding_reads=8,
                        kv_reads=2 * 2 * 1 * 4 * 5)  # layers x (K, V) x kv_heads x dims x context
    # Four new tokens: the prefill yields the first, three forwards the rest, over 4, 5, 6 keys.
    assert DECODER.decode(3, 4) == [DECODER.step(4), DECODER.step(5), DECODER.step(6)]


def test_bytes_per_precision():
    work = Work(linear_macs=1, weights=100, embedding_reads=10, kv_reads=20)
    assert bytes_read(work, "float32") == 4 * 130
    assert bytes_read(work, "bfloat16") == 2 * 130
    assert bytes_read(work, "int8-dynamic") == 100 + 4 * 30  # int8 weights, float32 activations and cache
    assert bytes_read(work, "int8-weight") == 100 + 2 * 30
    assert bytes_read(work, "int4-weight") == 100 * (0.5 + 4 / 128) + 2 * 30  # codes, a scale and offset per 128


# ------------------------------------------------------------------------- against the model classes

def test_encoder_counts_match_the_model_classes():
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertModel,
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
    )
    dims = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
                max_position_embeddings=64, attn_implementation="eager")  # eager: attention as matmuls torch counts
    ids = torch.randint(0, 50, (1, 7))
    cases = [(BertForSequenceClassification(BertConfig(num_labels=3, **dims)), None),
             (XLMRobertaForSequenceClassification(XLMRobertaConfig(num_labels=1, **dims)), None),
             (BertModel(BertConfig(**dims)), 0)]  # the embedder: a pooler, no labels
    for model, labels in cases:
        shape = EncoderShape.from_config(model.config, labels=labels)
        work = shape.forward(7)
        assert work.weights == linear_weights(model), type(model).__name__
        flops = counted_flops(lambda model=model: model.eval()(input_ids=ids))
        assert flops == 2 * (work.linear_macs + work.attention_macs), type(model).__name__


def test_decoder_counts_match_qwen2():
    from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=24, tie_word_embeddings=True,
                         attn_implementation="eager")
    model = Qwen2ForCausalLM(config).eval()
    shape = DecoderShape.from_config(config)
    assert shape.weights == linear_weights(model)  # the tied head counted once, as read once
    prompt = torch.randint(0, 40, (1, 5))
    prefill = shape.prefill(5)
    # Eager attention computes the whole 5x5 score matrix; the floor counts the causal half it needs.
    full_attention = 2 * shape.layers * shape.heads * shape.head_dim * 5 * 5
    assert counted_flops(lambda: model(input_ids=prompt, logits_to_keep=1)) == 2 * (prefill.linear_macs
                                                                                     + full_attention)
    cache = DynamicCache(config=config)
    with torch.inference_mode():
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    step = shape.step(6)  # the sixth token attends to all six
    assert counted_flops(lambda: model(input_ids=torch.tensor([[3]]), past_key_values=cache,
                                       use_cache=True)) == 2 * (step.linear_macs + step.attention_macs)
    assert step.kv_reads == sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers)


def test_configs_of_the_tiny_standins_give_their_loaded_weights(model_source, embedder, generator):
    models = tool.load_models(model_source)
    assert models.embed.forward(1).weights == linear_weights(embedder.model)
    assert models.generate.weights == linear_weights(generator.model)


# ------------------------------------------------------------------------- floors

def test_floor_is_the_max_of_the_two_bounds():
    fast = machine(float32=1e9, bandwidth=1e9)
    memory_bound = floor_of(Work(linear_macs=10, weights=100), "float32", fast)
    assert memory_bound.compute_s == pytest.approx(20e-9) and memory_bound.memory_s == pytest.approx(400e-9)
    assert memory_bound.floor_s == memory_bound.memory_s and memory_bound.bound == "memory"
    compute_bound = floor_of(Work(linear_macs=1000, weights=100), "float32", fast)
    assert compute_bound.floor_s == pytest.approx(2000e-9) and compute_bound.bound == "compute"


def test_int8_dynamic_runs_linears_at_the_int8_peak_and_attention_in_float32():
    m = machine(float32=1e9, int8=4e9, bandwidth=1e12)
    floor = floor_of(Work(linear_macs=400, attention_macs=100), "int8-dynamic", m)
    assert floor.compute_s == pytest.approx(800 / 4e9 + 200 / 1e9)
    assert floor_of(Work(linear_macs=400), "int8-weight", m).compute_s == pytest.approx(800 / 2e9)  # bf16 compute


def test_passes_are_floored_one_by_one():
    m = machine(float32=1e9, bandwidth=1e9)
    memory_pass, compute_pass = Work(weights=100), Work(linear_macs=1000)
    total = floor_of_passes([memory_pass, compute_pass], "float32", m)
    # Each pass waits for its own bound; one max over the sums would give 2000 ns instead of 2400.
    assert total.floor_s == pytest.approx(400e-9 + 2000e-9)


def test_concurrent_decode_reads_the_weights_once_per_step():
    one, eight = DECODER.step(10), DECODER.step(10, rows=8)
    assert eight.weights == one.weights
    assert (eight.linear_macs, eight.attention_macs, eight.kv_reads) == (8 * one.linear_macs, 8 * one.attention_macs,
                                                                         8 * one.kv_reads)
    assert bytes_read(eight, "float32") == 4 * (one.weights + 8 * (one.kv_reads + one.embedding_reads))
    tokens = RequestTokens(query=3, rerank=(5, 6), prompt=7, new_tokens=4, sentiment=5, toxicity=6)
    models = Models(ENCODER, ENCODER, DECODER, ENCODER, ENCODER)
    works = row_works(models, tokens, requests=8)
    assert [w.weights for w in works["decode"]] == [DECODER.weights] * 3  # one read per step for all eight
    assert works["rerank"] == [together([ENCODER.forward(5), ENCODER.forward(6)] * 8)]
    assert works["rerank"][0].weights == ENCODER.forward(5).weights
    # Memory-bound decode: each step reads the weights once and every sequence's own cache.
    m = machine(float32=1e12, bandwidth=1e9)
    plan = plan_floor("float32", dict.fromkeys(("embed", "rerank", "generate", "sentiment", "toxicity"), "float32"),
                      models, tokens, m, concurrency=8)
    assert plan.idle["decode"].bound == plan.concurrent["decode"].bound == "memory"
    per_step = [4 * (DECODER.weights + 8 * (DECODER.kv_per_token * context + DECODER.hidden)) for context in (8, 9, 10)]
    assert plan.concurrent["decode"].floor_s == pytest.approx(sum(per_step) / 1e9)
    assert plan.idle_s == pytest.approx(sum(f.floor_s for f in plan.idle.values()))
    assert plan.concurrent_rpm == pytest.approx(60 * 8 / plan.concurrent_s)


def test_measured_figures_as_multiples_of_the_floor():
    tokens = RequestTokens(query=3, rerank=(5,), prompt=7, new_tokens=3, sentiment=5, toxicity=5)
    plan = plan_floor("bfloat16", dict.fromkeys(("embed", "rerank", "generate", "sentiment", "toxicity"), "bfloat16"),
                      Models(ENCODER, ENCODER, DECODER, ENCODER, ENCODER), tokens, machine(), concurrency=8)
    rows = {c.what: c for c in compare(plan, {"embed": 3 * plan.idle["embed"].floor_s, "request": plan.idle_s,
                                              "concurrency_rpm": plan.concurrent_rpm / 4})}
    assert rows["embed"].times_floor == pytest.approx(3.0) and rows["embed"].fraction == pytest.approx(1 / 3)
    assert rows["request"].times_floor == pytest.approx(1.0)
    assert rows["concurrency_rpm (c=8)"].times_floor == pytest.approx(4.0)  # a quarter of the floor's throughput
    with pytest.raises(ValueError, match="unknown measured key"):
        compare(plan, {"embedding": 1.0})


def test_peaks_are_measured_and_threads_restored():
    before = torch.get_num_threads()
    measured = measure_machine(threads=1, matmul_size=32, bandwidth_mib=1, rounds=2, warmup=1,
                               flags=frozenset({"avx512_bf16", "sse2"}))
    assert torch.get_num_threads() == before
    assert set(measured.peaks) == {"float32", "bfloat16", "int8"} and min(measured.peaks.values()) > 0
    assert measured.read_bandwidth > 0 and measured.copy_bandwidth > 0
    assert measured.flags == ("avx512_bf16",) and measured.threads == 1
    assert "avx512_bf16" in measured.describe()
    assert matmul_peak("int8", 32, rounds=1, warmup=0) > 0


# ------------------------------------------------------------------------- the CLI

@pytest.mark.usefixtures("tool_commit")
def test_cli_end_to_end_on_the_tiny_standins(tmp_path, capsys):
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"precision": "float32", "times": {"embed": 0.01, "generate": 2.0,
                                                                       "request": 3.0, "concurrency_rpm": 10}}))
    started = time.perf_counter()
    code = tool.main(["--matmul-size", "64", "--bandwidth-mib", "2", "--rounds", "2", "--warmup", "1",
                      "--threads", "1", "--new-tokens", "4", "--measured", str(measured), "--out", str(tmp_path)],
                     env={**os.environ, **TEST_ENV})
    assert code == 0
    assert time.perf_counter() - started < 60  # seconds on an idle machine; generous for a shared one
    result = json.loads((tmp_path / "roofline.json").read_text())
    assert [p["name"] for p in result["plans"]] == ["float32", "bfloat16", "int8-dynamic", "int8-weight", "int4-dynamic",
                                                    "int4-weight", "fast"]
    assert result["model_source"] == "standin:tiny"
    tokens = result["tokens"]
    assert len(tokens["rerank"]) == 10 and all(n > 2 for n in tokens["rerank"])
    assert tokens["prompt"] > tokens["query"] > 2 and tokens["new_tokens"] == 4
    for plan in result["plans"]:
        assert set(plan["idle"]) == {"embed", "rerank", "prefill", "decode", "sentiment", "toxicity"}
        for floor in plan["idle"].values():
            assert floor["floor_s"] == pytest.approx(max(floor["compute_s"], floor["memory_s"]))
        assert plan["idle_s"] > 0 and plan["concurrent_rpm"] > 0
    comparisons = {c["what"]: c for c in result["measured"]["comparisons"]}
    assert result["measured"]["precision"] == "float32"
    assert set(comparisons) == {"embed", "generate", "request", "concurrency_rpm (c=8)"}
    float32 = result["plans"][0]
    assert comparisons["request"]["times_floor"] == pytest.approx(3.0 / float32["idle_s"])
    out = capsys.readouterr().out
    assert result["machine"]["cpu"] in out and "idle request s" in out and "x floor" in out


def test_the_requests_documents_come_from_a_data_builds_documents_db(model_source, course_data):
    """A course build's rows are a sentence each: its rerank pairs and prompt are shorter than the support corpus's,
    and each pair is counted from the build's own documents (the protocol's requests fetch those)."""
    support, support_counted = tool.request_tokens(model_source, 0, 4)
    course, counted = tool.request_tokens(model_source, 0, 4, documents_dir=course_data.db_path.parent)
    assert counted["documents"] == str(course_data.db_path.parent) and support_counted["documents"] == "support corpus"
    assert all(title.startswith("Document ") for title in counted["rerank_documents"])
    assert len(course.rerank) == 10 and max(course.rerank) < min(support.rerank)
    assert course.prompt < support.prompt and course.query == support.query


@pytest.mark.parametrize("make", [lambda tmp: tmp / "absent", lambda tmp: tmp])
def test_cli_refuses_a_documents_folder_without_documents_before_measuring(tmp_path, capsys, make):
    folder = make(tmp_path)
    assert tool.main(["--documents", str(folder), "--out", str(tmp_path / "out")], env={**os.environ, **TEST_ENV}) == 2
    assert f"--documents {folder}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_bad_measured_file_before_measuring(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"embed": -1}))
    assert tool.main(["--measured", str(bad), "--out", str(tmp_path)], env={**os.environ, **TEST_ENV}) == 2
    assert "positive numbers" in capsys.readouterr().err
    assert not (tmp_path / "roofline.json").exists()


def test_microbench_folder_gives_batch_one_medians(tmp_path):
    (tmp_path / "microbench_embed.csv").write_text("stage,batch_size,batch_s_median\nembed,1,0.02\nembed,8,0.1\n")
    (tmp_path / "microbench_generate.csv").write_text("stage,batch_size,batch_s_median\ngenerate,1,7.5\n")
    assert tool.read_microbench(tmp_path) == {"embed": 0.02, "generate": 7.5}
    with pytest.raises(tool.MeasuredError):
        tool.read_microbench(tmp_path / "nowhere")
