"""The profiling library under the command-line tools in profiling/.

cli: argument helpers (comma lists, positive numbers, the loopback-only target check);
load: load generation (open-loop schedules, closed loops, sweeps; bounded in count and time);
prometheus: /metrics scraping, snapshots and per-stage deltas;
cluster: every node's address from node 0's URL (its /health peers); a node not scraped is an error;
provenance: what a result was measured with (git commit, each node's /settings, caches that could answer);
report: statistics, saturation, tables, CSV/JSON files, the fresh runs/<tool>-<UTC time>/ folder;
plots: PNG plots (matplotlib, headless);
inputs: realistic stage inputs (queries, documents, answers) for the in-process benchmarks;
stage_bench: each worker stage loaded as a worker loads it, with its inputs (microbench);
memory: peak and current RSS; models: a tool's models as a worker runs them;
fidelity, variant_job: the precision variants' figures and the one-variant job (select_variants);
roofline, roofline_tables, machine_peaks: the floors of one request on this CPU (roofline).
"""
