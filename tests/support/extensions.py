"""The C++ extensions a kernel test needs (pipeline.kernels.compiled)."""
from __future__ import annotations

import pytest

from pipeline.kernels.compiled import CompiledExtension


def built_ops(extension: CompiledExtension, unused_here: str):
    """`extension`'s loaded module, built here where it is not yet (tests/conftest.py builds every extension
    for a whole session); the test skips with `unused_here` where this CPU lacks its instructions."""
    if not extension.cpu_supported():
        pytest.skip(unused_here)
    if extension.ops() is None:
        extension.build()
    return extension.ops()
