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


def forget_every_load(request) -> None:
    """Every extension's cached load (pipeline.kernels.compiled.EXTENSIONS) forgotten now and after the test: a
    test that points TORCH_EXTENSIONS_DIR elsewhere would otherwise leave a None cached for any extension first
    asked for meanwhile (an int8 Linear asks for the VNNI kernel), and later tests in the process would run
    without it."""
    import importlib

    from pipeline.kernels.compiled import EXTENSIONS

    def forget():
        for name in EXTENSIONS:
            importlib.import_module(name).EXTENSION.ops.cache_clear()
    forget()
    request.addfinalizer(forget)
