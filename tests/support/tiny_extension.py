"""A C++ extension of one trivial function: what tests of pipeline.kernels.compiled's builds compile."""
from pipeline.kernels.compiled import CompiledExtension

EXTENSION = CompiledExtension("rag_test_tiny", "int one() { return 1; }", ["one"], ["-O0"], frozenset())
