"""How we measure: stage microbenchmarks (`profiling.microbench`) and the HTTP load generator
(`profiling.loadgen`). Nothing here is imported by the service itself."""
