"""A C++ extension whose source does not compile: what tests of a failed build compile."""
from pipeline.kernels.compiled import CompiledExtension

EXTENSION = CompiledExtension("rag_test_broken", "int one() { return not_declared_anywhere; }", ["one"], ["-O0"],
                              frozenset())
