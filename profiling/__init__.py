"""How we measure: the command-line tools a user runs (microbench: each stage by batch size; bench_decode: the LLM's
decode step; loadgen: load against a cluster; latency_breakdown; roofline; soak; select_variants: each stage's
precision) over a small library, `profiling.lib`. Nothing here is imported by the service itself."""
