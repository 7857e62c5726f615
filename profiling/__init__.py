"""How we measure: thin command-line tools (loadgen, soak, microbench, latency_breakdown,
bench_*) over a small library, `profiling.lib` (load generation, /metrics parsing, reports,
plots, argument helpers). Nothing here is imported by the service itself."""
