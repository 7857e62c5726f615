"""The arithmetic behind the precision variants and batch invariance (pipeline.precision picks which runs).

* :mod:`pipeline.kernels.int8`: int8 Linears (per-channel weights; per-row activations or bfloat16 ones)
  and the in-place conversion of a model's Linears to them.
* :mod:`pipeline.kernels.fbgemm`: fbgemm's dynamic linear made to return `torch._int_mm`'s exact sums.
* :mod:`pipeline.kernels.fused_int8`: int8-dynamic's per-row quantize and rescale as two C++ passes
  (same bits), used where the extension has been built.
* :mod:`pipeline.kernels.ordered_attention`: the CPU's decode-step attention where it is built, each query's keys
  summed first to last in C++ (a row's bits by construction).
* :mod:`pipeline.kernels.avx512_bf16`: a bfloat16 Linear's product on a CPU with AVX-512 BF16, each row summed in
  one order (a row's bits by construction), where it is built.
* :mod:`pipeline.kernels.huge_pages`: CPU tensors in 2 MB pages where Linux gives them (the packed weights, the KV
  buffers).
* :mod:`pipeline.kernels.compiled`: builds and loads those C++ extensions (``python -m
  pipeline.kernels.compiled``).
* :mod:`pipeline.kernels.chunked_attention`: attention over fixed key chunks (CUDA's, and a CPU's where
  the ordered kernel is not built), and the dispatch between the kernels.
* :mod:`pipeline.kernels.batch_invariance`: float Linears and SDPA attention (decoders' and encoders')
  whose result for a row does not depend on its batch-mates.
* :mod:`pipeline.kernels.versions`: the torch and transformers versions these were verified against,
  and the check that refuses others.

Nothing here imports pipeline.precision. Importing this package imports nothing heavy; each module
imports torch itself.
"""
