"""The profiling library under the command-line tools in profiling/.

cli: argument helpers (comma lists, positive numbers, the loopback-only target check);
load: load generation (open-loop schedules, closed loops, sweeps; bounded in count and time);
prometheus: /metrics scraping, snapshots and per-stage deltas;
report: statistics, saturation, tables, CSV/JSON files;
plots: PNG plots (matplotlib, headless);
inputs: realistic stage inputs (queries, documents, answers) for the in-process benchmarks.
"""
