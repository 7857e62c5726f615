"""A decode step's memory floor (profiling/lib/decode_floor.py): the bytes it must read, the bandwidth it is
divided by, and what a step's multiple of it says."""
from __future__ import annotations

import os

import pytest
import torch

from profiling.lib import decode_floor as df


def test_the_floor_is_weights_plus_every_sequences_kv_over_the_bandwidth():
    floor = df.step_floor(10 ** 9, [100, 200, 300], kv_per_token=1000, bandwidth=20e9)
    assert (floor.weight_bytes, floor.kv_bytes, floor.bytes) == (10 ** 9, 600_000, 1_000_600_000)
    assert floor.floor_s == pytest.approx(1_000_600_000 / 20e9)
    assert floor.times_floor(2 * floor.floor_s) == pytest.approx(2.0)
    fields = df.floor_fields(floor, step_ms=75.0, products_ms=60.0)
    # The products read the weights alone: 10**9 bytes at 20 GB/s, 50 ms; the rest of the step is outside them.
    assert fields == {"weight_mb": 1000.0, "kv_mb": 0.6, "floor_ms": 50.03, "step_over_floor": 1.5,
                      "weights_floor_ms": 50.0, "products_over_floor": 1.2, "outside_ms": 15.0,
                      "arithmetic_floor_ms": None, "step_over_bound": None, "products_over_bound": None}
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        df.step_floor(1, [1], 1, 0.0)


def test_one_tokens_kv_bytes_for_qwen_0_5b():
    from transformers import Qwen2Config
    config = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, num_hidden_layers=24)
    assert df.kv_bytes_per_token(config, 2) == 24 * 2 * 2 * 64 * 2  # layers x (K, V) x kv heads x head_dim x bf16


def test_weight_bytes_count_every_linear_and_not_the_gathered_embedding():
    from pipeline.kernels.int4 import Int4WeightLinear
    from pipeline.kernels.int8 import Int8DynamicLinear
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 32))
    assert df.weight_bytes(model) == (64 * 32 + 32) * 4  # float32 weight and bias; the table is left out
    int8 = Int8DynamicLinear(torch.nn.Linear(64, 32))  # a packed copy (where used) is outside buffers()
    # int8 weight (the VNNI kernel's padded to 64 channels, with an int32 per channel), float32 scales and bias
    weight = 64 * 64 + 4 * 64 if int8.kernel == "vnni" else 64 * 32
    assert df.weight_bytes(int8) == weight + 4 * 32 + 4 * 32
    int4 = Int4WeightLinear(torch.nn.Linear(256, 32, bias=False))
    assert df.weight_bytes(int4) == 256 * 32 // 2 + 2 * 32 * 2 * 2  # two codes a byte; a bf16 scale and offset per group


def test_the_largest_cache_is_read_from_sysfs_and_a_buffer_below_eight_of_it_is_refused(tmp_path):
    for index, size in (("index0", "32K"), ("index2", "1024K"), ("index3", "32768K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert df.last_level_cache_bytes(tmp_path) == 32 * 2 ** 20
    assert df.last_level_cache_bytes(tmp_path / "absent") is None
    assert df.buffer_problem(2 ** 30, 32 * 2 ** 20) is None and df.buffer_problem(2 ** 30, None) is None
    assert "under 8x the last-level cache (32 MiB)" in df.buffer_problem(64 * 2 ** 20, 32 * 2 ** 20)


def test_the_bandwidth_is_a_positive_rate_and_torchs_thread_count_is_restored():
    before = torch.get_num_threads()
    assert df.read_bandwidth(16, threads=1, rounds=2) > 1e8  # any machine reads more than 100 MB/s
    assert torch.get_num_threads() == before


def test_the_probe_between_rounds_keeps_each_read_and_gives_the_fastest_as_the_bandwidth(monkeypatch):
    probe = df.BandwidthProbe(16)
    assert probe.fastest() is None and probe.bytes == 16 * 2 ** 20
    reads = []
    probe._reads = (lambda: reads.append("whole"), lambda: reads.append("rows"))  # the two reads, in turn
    clock = iter([0.0, 0.004, 1.0, 1.002, 2.0, 2.003])  # reads of 4, 2 and 3 ms
    monkeypatch.setattr(df.time, "perf_counter", lambda: next(clock))
    for _ in range(3):
        probe.sample()
    assert reads == ["whole", "rows", "whole"] and probe.samples == pytest.approx([0.004, 0.002, 0.003])
    assert probe.fastest() == pytest.approx(16 * 2 ** 20 / 0.002)
    assert probe.median() == pytest.approx(16 * 2 ** 20 / 0.003)


def test_a_real_probe_reads_at_a_positive_rate():
    probe = df.BandwidthProbe(16)
    probe.sample()
    probe.sample()
    assert len(probe.samples) == 2 and probe.fastest() > 1e8


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here"))])
def test_a_step_on_a_gpu_is_held_to_the_gpus_memory_and_on_the_cpu_to_its_threads(device):
    """A GPU's decode step reads its weights from the device's memory: the floor is that memory's bandwidth, not
    the host's at torch's thread count."""
    found = df.measure_bandwidths(16, device)
    threads = str(torch.get_num_threads())
    assert df.bandwidth_key(device) == (threads if device == "cpu" else device)
    assert set(found) == {"1", threads, str(os.cpu_count())} | ({device} if device != "cpu" else set())
    assert found[df.bandwidth_key(device)] > 1e8
    probe = df.BandwidthProbe(16, device)
    probe.sample()
    assert probe.fastest() > 1e8


def test_the_floor_table_has_a_line_per_row():
    rows = [{"precision": "int4-weight", "sequences": 8, "step_ms": 30.0, "floor_ms": 12.5, "step_over_floor": 2.4,
             "products_ms": 18.0, "weights_floor_ms": 11.5, "products_over_floor": 1.57, "outside_ms": 12.0,
             "weight_mb": 260.1, "kv_mb": 24.5}]
    lines = df.format_floor_rows(rows).splitlines()
    assert len(lines) == 3 and lines[2].split() == ["int4-weight", "8", "30.0", "-", "12.50", "2.40", "-", "-", "-",
                                                    "18.0", "11.50", "1.57", "12.0", "260.1", "24.50"]
    # the bandwidth the floor was read at, the step against the floor at the median read, the arithmetic floor and
    # the step against the larger floor, where given
    rows[0].update(floor_gb_s=21.3, step_over_median_floor=1.87, arithmetic_floor_ms=15.0, step_over_bound=2.0)
    assert df.format_floor_rows(rows).splitlines()[2].split()[3:9] == ["21.3", "12.50", "2.40", "1.87", "15.00", "2.00"]


def test_a_step_whose_products_were_not_timed_has_no_split_and_prints_dashes():
    floor = df.step_floor(10 ** 9, [100], kv_per_token=1000, bandwidth=20e9)
    fields = df.floor_fields(floor, step_ms=75.0, products_ms=None)  # a GPU's step: its products run async
    assert (fields["products_over_floor"], fields["outside_ms"], fields["weights_floor_ms"]) == (None, None, 50.0)
    row = {"precision": "bfloat16", "sequences": 8, "step_ms": 75.0, "products_ms": None, **fields}
    assert df.format_floor_rows([row]).splitlines()[2].split() == ["bfloat16", "8", "75.0", "-", "50.01", "1.50", "-", "-",
                                                                  "-", "-", "50.00", "-", "-", "1000.0", "0.10"]
