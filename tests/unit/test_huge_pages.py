"""pipeline/kernels/huge_pages.py: tensors in memory advised for 2 MB pages (the kernel's VMA flags read back from
/proc/self/smaps), the packed weights and the KV cache in it, torch's own allocation where none is given."""
from __future__ import annotations

import gc
from pathlib import Path

import pytest

from pipeline.kernels import huge_pages

MIB = 2 ** 20
needs_huge_pages = pytest.mark.skipif(not huge_pages.available(),
                                      reason=f"this kernel gives no 2 MB pages for the asking ({huge_pages.SETTING}: "
                                             f"{huge_pages.mode()})")


def _mapping(address: int) -> tuple[int, int, set[str]]:
    """(start, end, VmFlags) of this process's mapping holding `address`."""
    start = end = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            low, high = (int(part, 16) for part in head.split("-"))
            start, end = (low, high) if low <= address < high else (None, None)
        elif head == "VmFlags:" and start is not None:
            return start, end, set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def _resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize(("text", "expected"), [
    ("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"), ("always madvise [never]", "never"),
    ("always madvise never", None),
])
def test_the_mode_is_the_bracketed_word_of_the_setting(tmp_path, text, expected):
    setting = tmp_path / "enabled"
    setting.write_text(text)
    assert huge_pages.mode(setting) == expected


def test_no_setting_reads_as_no_mode(tmp_path):
    assert huge_pages.mode(tmp_path / "absent") is None


@needs_huge_pages
def test_a_large_tensor_starts_on_a_huge_page_and_only_its_whole_huge_pages_are_advised():
    import torch
    tensor = huge_pages.empty((5 * MIB + 1024,), torch.float32)  # ten huge pages and 4 KB
    nbytes = tensor.numel() * 4
    assert tensor.is_contiguous() and tensor.dtype == torch.float32 and tensor.data_ptr() % huge_pages.HUGE_PAGE == 0
    start, end, flags = _mapping(tensor.data_ptr())
    assert "hg" in flags, flags  # MADV_HUGEPAGE
    assert (start, end) == (tensor.data_ptr(), tensor.data_ptr() + nbytes // huge_pages.HUGE_PAGE * huge_pages.HUGE_PAGE)
    assert "hg" not in _mapping(tensor.data_ptr() + nbytes - 1)[2]  # the 4 KB tail: not a whole huge page
    tensor.copy_(torch.arange(tensor.numel(), dtype=torch.float32))
    assert tensor[-1].item() == tensor.numel() - 1


@needs_huge_pages
def test_a_copy_keeps_its_memory_alive_and_gives_it_back_when_dropped():
    import torch
    source = torch.arange(4 * MIB, dtype=torch.int32).view(2 * MIB, 2)
    copy = huge_pages.contiguous(source.t())
    assert copy.shape == (2, 2 * MIB) and copy.is_contiguous() and torch.equal(copy, source.t())
    del source
    gc.collect()
    assert copy[1, -1].item() == 4 * MIB - 1  # the mapping lives as long as the tensor
    before = _resident_bytes()
    for _ in range(12):  # 12 x 64 MiB written and dropped: unmapped each time, not held
        huge_pages.empty((64 * MIB,), torch.uint8).fill_(1)
    gc.collect()
    assert _resident_bytes() - before < 256 * MIB


def test_small_tensors_and_a_kernel_without_huge_pages_get_torchs_own_allocation(monkeypatch):
    import torch
    small = huge_pages.empty((3, 5), torch.bfloat16)
    assert small.shape == (3, 5) and small.untyped_storage().nbytes() == 30
    monkeypatch.setattr(huge_pages, "available", lambda: False)
    large = huge_pages.contiguous(torch.ones(4 * MIB).view(2, -1).t())
    assert large.shape == (2 * MIB, 2) and large.untyped_storage().nbytes() == 16 * MIB and bool((large == 1).all())


@needs_huge_pages
def test_every_packed_weight_lies_in_huge_pages():
    import torch

    from pipeline.kernels import avx512_bf16, vnni_int4, vnni_int8
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(2048, 1024, generator=generator).to(torch.bfloat16)  # 4 MB packed
    packed = avx512_bf16.pack(weight)
    assert "hg" in _mapping(packed.data_ptr())[2] and torch.equal(avx512_bf16.unpack(packed, 2048, 1024), weight)
    qweight = torch.randint(-127, 128, (4096, 1024), dtype=torch.int8, generator=generator)
    packed8, _ = vnni_int8.pack(qweight)
    assert "hg" in _mapping(packed8.data_ptr())[2] and torch.equal(vnni_int8.unpack(packed8, 4096, 1024), qweight)
    codes = torch.randint(0, 16, (8192, 1024), dtype=torch.uint8, generator=generator)
    scale = torch.rand(8192, 8, generator=generator).to(torch.bfloat16).float()
    packed4, params = vnni_int4.pack(codes, scale, -scale)
    assert "hg" in _mapping(packed4.data_ptr())[2]
    assert torch.equal(vnni_int4.unpack(packed4, params, 8192)[0], codes)


@needs_huge_pages
def test_the_slot_tables_keys_and_values_are_zeros_in_huge_pages():
    import torch

    from pipeline.continuous.slots import SlotRule, SlotTable
    from pipeline.kernels.chunked_attention import CHUNK
    table = SlotTable(SlotRule(4, 2 ** 14 // CHUNK * CHUNK, CHUNK))  # 16k columns x 2 heads x 64 x 2 bytes: 4 MB
    table.join(1, [5, 6], 100)
    table.begin_prefill(0, 0, 2)
    table.update(torch.ones(1, 2, 2, 64, dtype=torch.bfloat16), torch.ones(1, 2, 2, 64, dtype=torch.bfloat16), 0)
    keys = table.keys[0]
    assert keys.dtype == torch.bfloat16 and "hg" in _mapping(keys.data_ptr())[2]
    assert int(keys.count_nonzero()) == 2 * 2 * 64  # the two written columns; the rest zeros
