"""The profiling library under the command-line tools in profiling/ (docs/architecture.md lists its modules)."""
