"""NVIDIA's Multi-Process Service around a check's processes: without it the processes that share one GPU (a
local cluster's two workers) run their kernels in turns, one context's time slice after another's; with it their
kernels run side by side, as one context's streams do."""
from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"  # NVIDIA's driver ships it


@contextlib.contextmanager
def daemon(env: dict[str, str], folder: Path) -> Iterator[None]:
    """MPS's control daemon, with its pipe and log folders under `folder`, for as long as the block runs; `env`
    gets those folders, so that every process started with it is the daemon's client. Raises RuntimeError where
    the control program is not on PATH."""
    control = shutil.which(CONTROL, path=env.get("PATH"))
    if control is None:
        raise RuntimeError(f"--mps: {CONTROL} is not on PATH (NVIDIA's driver ships it)")
    pipe, logs = folder / "pipe", folder / "log"
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env.update(CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(logs))
    subprocess.run([control, "-d"], env=env, check=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run([control], input="quit\n", text=True, env=env, timeout=30)
