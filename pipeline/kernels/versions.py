"""The torch and transformers versions the kernels were verified against, and the check that refuses others.

The kernels use private or unstable APIs whose names, signatures or behaviour may change in any
minor release:

* torch: `torch._int_mm`, `torch._weight_int8pack_mm`, `torch._make_per_channel_quantized_tensor`,
  `torch.ops.quantized.linear_prepack` / `linear_dynamic` / `linear_unpack` (pipeline.kernels.int8,
  pipeline.kernels.fbgemm), `torch.ops.aten._convert_weight_to_int4pack_for_cpu` and
  `_weight_int4pack_mm_for_cpu` (pipeline.kernels.int4: its packing, group layout and offset of 8, checked
  at load by `int4_is_exact`), `torch.ops.mkldnn._linear_pointwise`,
  `torch.ops.aten._scaled_dot_product_flash_attention_for_cpu` and its log-sum-exp
  (pipeline.kernels.chunked_attention), and the row-count-dependent summation of the float GEMMs
  and of SDPA's CPU kernel that pipeline.kernels.batch_invariance works around.
* transformers: `AttentionInterface`, `integrations.sdpa_attention.sdpa_attention_forward`,
  `masking_utils.ALL_MASK_ATTENTION_FUNCTIONS` and `sdpa_mask` (and which masks they pass)
  (pipeline.kernels.batch_invariance); a decoder's forward taking a dict of 4-d masks as is, passing
  its extra keyword arguments on to the attention function, and calling its cache's `update` once per
  layer (pipeline.continuous.slots: prefill chunks and decode steps both write into the slot table).

:func:`check_kernel_versions` runs where a kernel is first put to use, not at import.
"""
from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from pipeline.config import ConfigError
from pipeline.cpu_features import onednn_isa_problem

# torch, per device the kernels run on. CPU: 2.12.0 and 2.13.0 (int4-weight: 2.13.0 only,
# tests/unit/test_int4_kernels.py; tests/unit/test_int8_kernels.py,
# test_fused_int8.py, test_kernel_versions.py, test_precision.py, test_continuous.py, test_stages.py and
# test_chunked_attention.py pass with each). Not 2.11.0 there: its oneDNN float32 product gives a row other
# bits from 17 rows up, so float32 Linears are not row-invariant (test_precision.py's float32 cases fail).
# CUDA: 2.11.0, the GPU image's torch (test_precision.py's and test_chunked_attention.py's CUDA cases, on
# an H100); 2.12 and 2.13 were not run on a GPU. The next minor may move or drop any of the private ops.
TORCH_VERIFIED = {"cpu": ">=2.12,<2.14", "cuda": ">=2.11,<2.12"}
# transformers: 5.0.0, 5.12.1 and 5.24.0, the newest release when checked (test_precision.py,
# test_continuous.py and test_stages.py pass). Not <6: 5.x removes things in minor releases (the
# `past_key_values` argument pipeline.continuous.runner passes is to go in 5.40), and the attention
# and cache hooks above are internals.
TRANSFORMERS_VERIFIED = ">=5.0,<5.25"


def _problem(package: str, verified: str, installed_version: Callable[[str], str]) -> str | None:
    """One line saying why `package` is outside `verified`, or None where it is inside."""
    try:
        found = installed_version(package)
    except metadata.PackageNotFoundError:
        return f"{package} is not installed: the kernels need {package}{verified}"
    try:
        inside = SpecifierSet(verified).contains(Version(found), prereleases=True)  # a 2.13.1rc1 is still 2.13
    except InvalidVersion:
        inside = False
    if inside:
        return None
    return (f"{package} {found} is installed, but the int8 and batch-invariant kernels (pipeline/kernels) use its "
            f"private APIs and were verified only with {package}{verified}: install {package}{verified}")


def check_kernel_versions(device: str = "cpu", *, installed_version: Callable[[str], str] = metadata.version) -> None:
    """Raise ConfigError, one line per package, where torch or transformers is outside the versions
    verified for kernels on `device` ("cpu" or "cuda"), and on the CPU where oneDNN may run AMX
    (pipeline.cpu_features.onednn_isa_problem).

    `installed_version(name)` gives a distribution's version string (importlib.metadata.version)."""
    verified = {"torch": TORCH_VERIFIED["cuda" if device.startswith("cuda") else "cpu"],
                "transformers": TRANSFORMERS_VERIFIED}
    problems = [p for package, spec in verified.items() if (p := _problem(package, spec, installed_version))]
    if not device.startswith("cuda") and (isa := onednn_isa_problem()):
        problems.append(isa)
    if problems:
        raise ConfigError(*problems)
