"""profiling.lib.cuda_mps: the MPS control daemon started for a block with its folders in the environment the
check's processes get, and told to quit after it; refused by name where the control program is missing."""
import os
import stat

import pytest

from profiling.lib import cuda_mps


def fake_control(folder, calls):
    """A stand-in for nvidia-cuda-mps-control that records its arguments, stdin and MPS folders."""
    script = folder / cuda_mps.CONTROL
    script.write_text(f'#!/bin/sh\necho "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$(cat)" >> {calls}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.slow  # runs a stand-in control program
def test_the_daemon_runs_for_the_block_and_its_folders_reach_the_environment(tmp_path):
    calls = tmp_path / "calls.txt"
    (tmp_path / "bin").mkdir()
    fake_control(tmp_path / "bin", calls)
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    with cuda_mps.daemon(env, tmp_path / "mps"):
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "pipe")
        assert (tmp_path / "mps" / "log").is_dir() and env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "mps" / "log")
        started = calls.read_text().splitlines()
        assert started == [f"args=-d pipe={tmp_path / 'mps' / 'pipe'} stdin="]
    assert calls.read_text().splitlines()[1:] == [f"args= pipe={tmp_path / 'mps' / 'pipe'} stdin=quit"]


@pytest.mark.slow  # runs a stand-in control program
def test_a_failing_block_still_stops_the_daemon(tmp_path):
    calls = tmp_path / "calls.txt"
    fake_control(tmp_path, calls)
    with pytest.raises(KeyError), cuda_mps.daemon({"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}, tmp_path / "mps"):
        raise KeyError("a phase failed")
    assert calls.read_text().splitlines()[-1].endswith("stdin=quit")


def test_without_the_control_program_the_check_is_refused_by_name(tmp_path):
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control is not on PATH"):
        with cuda_mps.daemon({"PATH": str(tmp_path)}, tmp_path / "mps"):
            pass
