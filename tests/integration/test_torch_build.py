"""`./run.sh setup` installs the torch build the machine can use: CUDA where `nvidia-smi -L` lists a GPU,
else the CPU build; TORCH_BUILD overrides. Probed through `./run.sh torch-build`, with fake `nvidia-smi`s."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # starts bash processes

CPU_WHEEL = "torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu"


def torch_build(tmp_path: Path, nvidia_smi: str | None, **env: str) -> subprocess.CompletedProcess:
    """`./run.sh torch-build` with PATH holding only a fake nvidia-smi (a script body, or none) and the basics."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    if nvidia_smi is not None:
        probe = fake_bin / "nvidia-smi"
        probe.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        probe.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if k not in ("TORCH_BUILD", "TORCH_CPU_INDEX_URL")}
    return subprocess.run(["bash", str(REPO_ROOT / "run.sh"), "torch-build"], capture_output=True, text=True,
                          timeout=30, env={**clean, "PATH": f"{fake_bin}:/usr/bin:/bin", **env})


def expected_cpu() -> str:
    on_x86_linux = platform.system() == "Linux" and platform.machine() == "x86_64"
    return f"cpu: pip install {CPU_WHEEL if on_x86_linux else 'torch==2.13.0'}"


def test_no_nvidia_smi_gets_the_cpu_build(tmp_path):
    proc = torch_build(tmp_path, None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected_cpu()


def test_an_nvidia_smi_without_a_gpu_gets_the_cpu_build(tmp_path):
    # A driver without a usable GPU: nvidia-smi fails, as it does in a container without the device.
    proc = torch_build(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected_cpu()


def test_a_listed_gpu_gets_the_cuda_build(tmp_path):
    proc = torch_build(tmp_path, 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "cuda: pip install torch==2.11.0"  # the version the CUDA kernels accept


@pytest.mark.parametrize("build, gpu", [("cpu", True), ("cuda", False)])
def test_torch_build_overrides_the_probe(tmp_path, build, gpu):
    proc = torch_build(tmp_path, 'echo "GPU 0: NVIDIA H100"' if gpu else None, TORCH_BUILD=build)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(":")[0] == build


def test_the_cpu_index_can_be_overridden(tmp_path):
    if (platform.system(), platform.machine()) != ("Linux", "x86_64"):
        pytest.skip("the CPU index is used on Linux x86-64 only")
    proc = torch_build(tmp_path, None, TORCH_CPU_INDEX_URL="https://mirror.example/whl/cpu")
    assert proc.stdout.strip().endswith("--extra-index-url https://mirror.example/whl/cpu")


def test_a_bad_torch_build_is_refused_naming_the_variable(tmp_path):
    proc = torch_build(tmp_path, None, TORCH_BUILD="rocm")
    assert proc.returncode == 2
    assert "TORCH_BUILD='rocm' is not valid" in proc.stderr


def test_the_constraints_file_pins_every_package_but_torch():
    lines = [line for line in (REPO_ROOT / "constraints.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    assert lines and all("==" in line for line in lines)
    names = {line.split("==")[0].lower() for line in lines}
    assert "torch" not in names and {"transformers", "flask", "faiss-cpu"} <= names
