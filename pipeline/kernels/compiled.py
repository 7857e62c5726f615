"""The project's C++ kernels: each compiled once per source version, found and loaded without a compiler.

A :class:`CompiledExtension` is one inline C++ source (torch's `load_inline`), compiled by :meth:`build`
into torch's extension cache (``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``), one
folder per version of its source, its flags and torch. :meth:`ops` only loads what is already built: a
model load never waits for a compiler. Where nothing is built, the library does not load, or the CPU
lacks the instructions it was compiled for, :meth:`ops` is None and its callers run torch's ops.

``python -m pipeline.kernels.compiled`` builds every extension (``./run.sh setup``, the image's
kernel stage): :data:`EXTENSIONS` lists them.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

# The extensions' modules, each defining EXTENSION: what `python -m pipeline.kernels.compiled` builds.
EXTENSIONS = ("pipeline.kernels.fused_int8", "pipeline.kernels.ordered_attention", "pipeline.kernels.vnni_int8",
              "pipeline.kernels.avx2_int8", "pipeline.kernels.decode_glue", "pipeline.kernels.vnni_int4",
              "pipeline.kernels.avx2_int4", "pipeline.kernels.avx512_bf16", "pipeline.kernels.decode_layers",
              "pipeline.kernels.greedy_choice")


class CompiledExtension:
    """One C++ source, its exported functions, compiler flags and the CPU flags its code needs."""

    def __init__(self, stem: str, source: str, functions: list[str], cflags: list[str], cpu_flags: frozenset[str],
                 ldflags: tuple[str, ...] = ()):
        self.source, self.functions, self.cflags, self.ldflags = source, functions, cflags, list(ldflags)
        self.cpu_flags = cpu_flags
        version = hashlib.sha256((source + " ".join(cflags) + " ".join(ldflags)).encode()).hexdigest()[:12]
        self.name = f"{stem}_{version}"
        self.ops = functools.cache(self._load)

    def build_directory(self, torch_version: str | None = None) -> Path:
        """Where this source version is (or would be) built: torch's extension cache, one folder per version
        (of this source and of torch: the imported one's unless given)."""
        if torch_version is None:
            import torch
            torch_version = torch.__version__
        root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(Path.home(), ".cache", "torch_extensions")
        return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}_cpu_torch{torch_version}" / self.name

    def cpu_supported(self) -> bool:
        from pipeline.cpu_features import cpu_flags
        return self.cpu_flags <= cpu_flags()

    def _library(self, directory: Path) -> Path | None:
        found = [p for p in directory.glob(f"{self.name}*.so") if p.is_file()] if directory.is_dir() else []
        return found[0] if found else None

    def nothing_to_build(self) -> str | None:
        """Why :meth:`build` has nothing to do, in words, or None where it would compile: this version is built
        (its library in the folder of the installed torch's version, found without importing torch, which every
        `./run.sh` start asks; or else it loads), or this CPU lacks the flags (nothing would load it)."""
        if not self.cpu_supported():
            return f"nothing to build: this CPU lacks {', '.join(sorted(self.cpu_flags))}; torch's own ops run instead"
        installed = _installed_torch_version()
        if installed is not None and self._library(found := self.build_directory(installed)) is not None:
            return f"{self.name} is built in {found}"
        if self.ops() is not None:
            return f"{self.name} is built in {self.build_directory()}"
        return None

    def build(self) -> str:
        """Compile the extension into :meth:`build_directory`; raises where there is no compiler. Nothing to
        do, and no compiler or lock needed (the cache may be read-only, as in the image), where
        :meth:`nothing_to_build` says why. Returns what it did, in words."""
        if (done := self.nothing_to_build()) is not None:
            return done
        from torch.utils.cpp_extension import load_inline
        directory = self.build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        # EXTENSION_NAMESPACE: where a source registers ops with torch's dispatcher (TORCH_LIBRARY), one per version
        load_inline(self.name, cpp_sources=self.source, functions=self.functions,
                    extra_cflags=[*self.cflags, f"-DEXTENSION_NAMESPACE={self.name}"],
                    extra_ldflags=self.ldflags, build_directory=str(directory), verbose=False)
        self.ops.cache_clear()
        return f"built {self.name} in {directory}"

    def registered(self, op: str) -> Any:
        """`op` as the source registers it with torch's dispatcher (``TORCH_LIBRARY(EXTENSION_NAMESPACE, m)``:
        profilers and dispatch modes see it, unlike a function of :meth:`ops`), or None where not loaded."""
        if self.ops() is None:
            return None
        import torch
        return getattr(getattr(torch.ops, self.name), op)

    def _load(self) -> ModuleType | None:
        """The built extension, or None where it is not built for this source version and torch, does not
        load, or this CPU lacks its flags. Never compiles."""
        library = self._library(self.build_directory())
        if library is None or not self.cpu_supported():
            return None
        import torch  # noqa: F401  (the extension links against torch's libraries, loaded by this import)
        loader = importlib.machinery.ExtensionFileLoader(self.name, str(library))
        spec = importlib.util.spec_from_file_location(self.name, str(library), loader=loader)
        if spec is None:
            return None
        try:
            module = importlib.util.module_from_spec(spec)  # dlopen happens here
            loader.exec_module(module)
        except (ImportError, OSError):  # a half-written or foreign library: torch's ops run instead
            return None
        return module


def _installed_torch_version() -> str | None:
    """torch's version as installed, read without importing torch (about 1.5 s of CPU)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def build_all(modules: tuple[str, ...] = EXTENSIONS) -> list[str]:
    """Build the extension of each of `modules` (each defining EXTENSION; default every one in :data:`EXTENSIONS`),
    what each build did in words. Those to compile build side by side, one process each and as many at once as
    there are cores (each is one g++ on one core: nine took 34 s together on 16 cores where one after the other took
    about three minutes). Raises RuntimeError naming each extension that failed to build, with the end of its
    error, once the others are done."""
    import importlib
    import subprocess
    from concurrent.futures import ThreadPoolExecutor
    said = {name: importlib.import_module(name).EXTENSION.nothing_to_build() for name in modules}
    root = Path(__file__).resolve().parents[2]  # where `pipeline` (and any module named) imports from

    def build(name: str) -> subprocess.CompletedProcess:
        code = f"import importlib; print(importlib.import_module({name!r}).EXTENSION.build())"
        path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                              env={**os.environ, "PYTHONPATH": path})

    pending = [name for name, done in said.items() if done is None]
    with ThreadPoolExecutor(max_workers=max(1, min(len(pending), os.cpu_count() or 1))) as pool:
        finished = dict(zip(pending, pool.map(build, pending)))
    for name in pending:  # asked above, before they were built: the None cached then is stale now
        importlib.import_module(name).EXTENSION.ops.cache_clear()
    failed = [f"{name}: {run.stderr.strip()[-2000:]}" for name, run in finished.items() if run.returncode]
    if failed:
        raise RuntimeError("C++ extensions failed to build:\n" + "\n".join(failed))
    said.update({name: run.stdout.strip().splitlines()[-1] for name, run in finished.items()})
    return [said[name] for name in modules]


if __name__ == "__main__":
    import time
    started = time.perf_counter()
    for done in build_all():
        print(done)
    print(f"({time.perf_counter() - started:.1f} s)")
