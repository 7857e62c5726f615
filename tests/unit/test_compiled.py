"""pipeline.kernels.compiled: each C++ extension is found built without a compiler, loads only what is built
for its source version and torch, and where nothing is (or the CPU lacks its flags) gives None, so that
its callers run torch's ops; `python -m pipeline.kernels.compiled` builds every one."""
import importlib

import pytest
import torch

from pipeline.kernels import compiled
from tests.support.extensions import forget_every_load

EXTENSIONS = [pytest.param(importlib.import_module(name).EXTENSION, id=name.rsplit(".", 1)[1])
              for name in compiled.EXTENSIONS]


@pytest.fixture
def clean_cache(request):
    """Each extension's cached load forgotten before and after (the test may point it at another folder)."""
    forget_every_load(request)


@pytest.mark.parametrize("extension", EXTENSIONS)
def test_nothing_built_means_no_ops_and_no_compiler_run(extension, tmp_path, monkeypatch, clean_cache):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert extension.ops() is None
    assert list(tmp_path.iterdir()) == []  # looked, built nothing


@pytest.mark.parametrize("extension", EXTENSIONS)
def test_a_library_that_does_not_load_means_no_ops(extension, tmp_path, monkeypatch, clean_cache):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = extension.build_directory()
    folder.mkdir(parents=True)
    (folder / f"{extension.name}.so").write_bytes(b"not a shared library")  # an interrupted copy, say
    assert extension.ops() is None


@pytest.mark.parametrize("extension", EXTENSIONS)
def test_the_build_folder_names_the_source_version_and_torch(extension, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = extension.build_directory()
    assert folder.parent.parent == tmp_path and folder.name == extension.name
    assert torch.__version__ in folder.parent.name
    assert extension.build_directory(compiled._installed_torch_version()) == folder  # read without torch


def test_another_source_or_flag_is_another_version():
    one = compiled.CompiledExtension("x", "int f() { return 1; }", ["f"], ["-O2"], frozenset())
    assert compiled.CompiledExtension("x", "int f() { return 2; }", ["f"], ["-O2"], frozenset()).name != one.name
    assert compiled.CompiledExtension("x", "int f() { return 1; }", ["f"], ["-O3"], frozenset()).name != one.name
    assert compiled.CompiledExtension("x", "int f() { return 1; }", ["f"], ["-O2"], frozenset()).name == one.name


def _compiler_refused(monkeypatch):
    from torch.utils import cpp_extension

    def refuse(*args, **kwargs):  # what the image's numeric user meets: no compiler, a root-owned cache
        raise PermissionError("the build lock cannot be taken")
    monkeypatch.setattr(cpp_extension, "load_inline", refuse)


@pytest.mark.parametrize("extension", EXTENSIONS)
def test_a_cpu_without_the_flags_builds_nothing(extension, tmp_path, monkeypatch, clean_cache):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(extension, "cpu_supported", lambda: False)
    _compiler_refused(monkeypatch)
    assert "nothing to build" in extension.build()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # builds what is not built yet (tests/conftest.py builds them first where g++ is)
@pytest.mark.parametrize("extension", EXTENSIONS)
def test_where_it_is_built_build_needs_neither_compiler_nor_lock(extension, monkeypatch):
    if not extension.cpu_supported():
        pytest.skip(f"this CPU lacks {sorted(extension.cpu_flags)}: nothing is built for it")
    extension.build()
    built = extension.ops()
    assert built is not None
    _compiler_refused(monkeypatch)
    assert extension.build() == f"{extension.name} is built in {extension.build_directory()}"
    assert extension.ops() is built
    # Nor loading it (which imports torch): the library is found in the installed torch's folder.
    with monkeypatch.context() as patched:
        patched.setattr(extension, "ops", lambda: pytest.fail("build() loaded the library"))
        assert extension.build() == f"{extension.name} is built in {extension.build_directory()}"


@pytest.mark.slow  # compiles two small extensions (tens of seconds: torch's headers)
def test_build_all_compiles_side_by_side_and_names_the_extension_that_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # the build processes inherit it
    tiny, broken = "tests.support.tiny_extension", "tests.support.broken_extension"
    extension = importlib.import_module(tiny).EXTENSION
    extension.ops.cache_clear()
    assert extension.ops() is None  # what build_all asks first, cached
    with pytest.raises(RuntimeError, match=r"(?s)tests\.support\.broken_extension: .*not_declared_anywhere") as failed:
        compiled.build_all((tiny, broken))
    assert tiny + ":" not in str(failed.value)
    assert extension._library(extension.build_directory()) is not None  # built, though the other failed
    assert extension.ops() is not None  # and loaded in this process, where the build processes built it
    _compiler_refused(monkeypatch)  # and found built in this process, with no compiler
    assert compiled.build_all((tiny,)) == [f"{extension.name} is built in {extension.build_directory()}"]

