"""`./run.sh setup` installs what serving needs and nothing of the tests; `./run.sh test` adds the test
extra and the tools the tests drive. Run for real on a copy of run.sh and the requirement files whose
venv Python, ruff, mypy and tool installers are stand-ins that record how they were called (the real
installs take minutes and the network); `setup --plan` lists the same steps without running them."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # starts bash processes

RECORDER = '#!/bin/sh\necho "{name} $*" >> "{log}"\n'


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """run.sh and its requirement files, with a venv of recording stand-ins and recording tool installers."""
    root = tmp_path / "checkout"
    for name in ("run.sh", "setup.cfg", "pyproject.toml", "constraints.txt"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, root / name)
    log = tmp_path / "calls.log"
    for path in (".venv/bin/python", ".venv/bin/ruff", ".venv/bin/mypy", "deploy/install-test-tools.sh",
                 "deploy/install-container-tools.sh", "deploy/install-browser.sh"):
        script = root / path
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(RECORDER.format(name=Path(path).name, log=log))
        script.chmod(0o755)
    return root


def run(root: Path, *args: str) -> list[str]:
    """`./run.sh args` in the copy (CPU torch, no GPU probe); the calls it made, one line each."""
    log = root.parent / "calls.log"
    log.unlink(missing_ok=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TORCH_")}, "TORCH_BUILD": "cpu"}
    done = subprocess.run(["bash", str(root / "run.sh"), *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines() if log.exists() else []


def pip_installs(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("python -m pip install")]


def test_setup_installs_serving_only_and_test_adds_the_test_extra_and_tools(checkout):
    calls = run(checkout, "setup")
    (torch, project) = pip_installs(calls)
    assert "--no-deps torch==" in torch
    assert project.endswith("-c constraints.txt -e .[tracing]")  # the project and OpenTelemetry, no [test]
    assert "python -m pipeline.kernels.compiled" in calls
    assert not [c for c in calls if c.startswith(("install-test-tools", "install-container-tools", "install-browser", "ruff", "mypy"))]
    assert (checkout / ".venv" / ".installed").read_text().split()[1] == "tracing"
    assert pip_installs(run(checkout, "setup")) == []  # a second setup installs nothing

    calls = run(checkout, "test", "-q")
    assert [c for c in pip_installs(calls) if " -e " in c] == [project.replace("[tracing]", "[test,tracing]")]
    for step in ("install-test-tools.sh", "install-container-tools.sh", "install-browser.sh", "ruff check --quiet .",
                 "mypy --no-error-summary", "python -m pytest -q"):
        assert [c for c in calls if c.startswith(step)], (step, calls)
    # A test machine's venv has everything serving needs: a node's start installs nothing.
    assert pip_installs(run(checkout, "setup")) == []


def test_setup_plan_lists_the_steps_and_runs_none(checkout):
    serving = subprocess.run(["bash", str(checkout / "run.sh"), "setup", "--plan"], cwd=checkout, capture_output=True,
                             text=True, timeout=60, env={**os.environ, "TORCH_BUILD": "cpu"})
    assert serving.returncode == 0, serving.stderr
    assert not (checkout.parent / "calls.log").exists()  # nothing ran
    lines = serving.stdout.splitlines()
    assert any(line.endswith("pip install -c constraints.txt -e .[tracing]") for line in lines)
    assert not [line for line in lines if "[test" in line or line.startswith("tools ")]
    tests = subprocess.run(["bash", str(checkout / "run.sh"), "setup", "--plan", "test"], cwd=checkout,
                           capture_output=True, text=True, timeout=60, env={**os.environ, "TORCH_BUILD": "cpu"})
    assert "-e .[test,tracing]" in tests.stdout and "install-container-tools.sh" in tests.stdout
    run(checkout, "setup")
    again = subprocess.run(["bash", str(checkout / "run.sh"), "setup", "--plan"], cwd=checkout, capture_output=True,
                           text=True, timeout=60, env={**os.environ, "TORCH_BUILD": "cpu"})
    assert "nothing to install" in again.stdout and "pip install" not in again.stdout
