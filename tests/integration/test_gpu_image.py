"""The GPU image (issue 52): deploy/Dockerfile with TORCH_BUILD=cuda builds rag-service:gpu,
whose torch is PyPI's CUDA build at the version the CUDA kernels accept, with its CUDA libraries (no
CUDA base image); the CUDA check deploy/README.md gives operators runs in it and, without a GPU,
says so in one line; where this host has an NVIDIA GPU and Docker's GPU support, it passes.

Opt-in: the CUDA wheels are gigabytes (a 5.3 GB image against the CPU one's 1.5 GB), so the default
`./run.sh test` skips it. Run it with

    RAG_GPU_IMAGE_TEST=1 .venv/bin/python -m pytest tests/integration/test_gpu_image.py

Needs what test_containers.py needs (a Docker daemon, the base image or debootstrap) and PyPI.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

import pytest

from pipeline.config import REPO_ROOT
from pipeline.kernels.versions import TORCH_VERIFIED
from tests.support.containers import (
    BASE_IMAGE,
    DOCKER,
    build,
    clean_checkout,
    docker,
    why_not,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

GPU_IMAGE = "rag-service:gpu"
OPT_IN = "RAG_GPU_IMAGE_TEST"


def cuda_check() -> str:
    """The CUDA check as deploy/README.md gives it (the line after its marker comment)."""
    text = (REPO_ROOT / "deploy" / "README.md").read_text()
    return re.search(r"# the image's CUDA check\n(docker run [^\n]+)\n", text).group(1)


@pytest.fixture(scope="module")
def gpu_image(tmp_path_factory):
    if os.environ.get(OPT_IN) != "1":
        pytest.skip(f"the GPU image pulls gigabytes of CUDA wheels: set {OPT_IN}=1 to build it")
    problem = why_not()
    if problem:
        pytest.skip(problem)
    made = subprocess.run([str(REPO_ROOT / "deploy" / "make-base-image.sh"), BASE_IMAGE], capture_output=True,
                          text=True, timeout=1200, env={**os.environ, "DOCKER": DOCKER})
    assert made.returncode == 0, made.stderr[-3000:]
    context = clean_checkout(tmp_path_factory.mktemp("checkout"))
    seconds, _log = build(context, None, tag=GPU_IMAGE, build_args=("TORCH_BUILD=cuda",), timeout_s=3000)
    size = int(docker("image", "inspect", "-f", "{{.Size}}", GPU_IMAGE).stdout)
    print(f"\n[gpu image] built in {seconds:.0f} s, {size / 2**30:.1f} GiB")
    return GPU_IMAGE


def test_the_gpu_image_has_cuda_torch_at_the_verified_version_and_the_node_starts_offline(gpu_image):
    probe = ("import torch, importlib.metadata as m; from packaging.specifiers import SpecifierSet; "
             f"assert m.version('torch') in SpecifierSet({TORCH_VERIFIED['cuda']!r}), m.version('torch'); "
             "assert torch.version.cuda, 'a CPU build'; "
             # cuDNN and NCCL load from the wheels' libraries (no GPU needed to load them)
             "assert torch.backends.cudnn.version() and torch.cuda.nccl.version(); "
             "from pipeline.kernels.versions import check_kernel_versions; check_kernel_versions('cuda'); "
             "print('cuda', torch.version.cuda)")
    run = docker("run", "--rm", "--network", "none", "--entrypoint", "python", gpu_image, "-c", probe)
    assert run.stdout.startswith("cuda "), run.stderr
    # run.sh's setup finds the image's own stamp (TORCH_BUILD=cuda): no install, offline.
    settings = docker("run", "--rm", "--network", "none", gpu_image, "settings")
    assert "[run.sh]" not in settings.stderr, settings.stderr
    env = docker("image", "inspect", "-f", "{{json .Config.Env}}", gpu_image).stdout
    assert '"TORCH_BUILD=cuda"' in env


def test_the_cuda_check_says_no_gpu_in_one_line_or_passes_on_a_gpu(gpu_image):
    command = shlex.split(cuda_check())
    assert command[:5] == ["docker", "run", "--rm", "--gpus", "all"] and GPU_IMAGE in command
    # The same check on this machine's Docker without a GPU to hand over.
    result = subprocess.run([DOCKER, "run", "--rm", "--network", "none", *command[5:]], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode != 0 and "no GPU visible" in result.stderr, (result.stdout, result.stderr[-2000:])
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        on_gpu = subprocess.run([DOCKER, *command[1:]], capture_output=True, text=True, timeout=300)
        assert on_gpu.returncode == 0 and on_gpu.stdout.startswith("cuda ok:"), on_gpu.stderr[-2000:]
