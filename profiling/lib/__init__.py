"""The profiling library under the command-line tools in profiling/.

cli: argument helpers (comma lists, positive numbers, the loopback-only target check);
load: load generation (open-loop schedules, closed loops, sweeps; bounded in count and time);
prometheus: /metrics scraping, snapshots and per-stage deltas;
cluster: every node's address from node 0's URL (its /health peers); a node not scraped is an error;
provenance: what a result was measured with (git commit, each node's /settings, caches that could answer);
report: statistics, saturation, tables, CSV/JSON files, the fresh runs/<tool>-<UTC time>/ folder;
plots: PNG plots (matplotlib, headless);
inputs: realistic stage inputs (queries, documents, answers) for the in-process benchmarks.
"""
