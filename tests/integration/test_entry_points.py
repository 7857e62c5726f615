"""Entry points started as processes: bad settings are one line each, not a traceback; run.sh help."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import REPO_ROOT, Settings
from pipeline.cpu_features import cpu_supports_bf16
from pipeline.models import ALL_MODELS, MODEL_REVISIONS
from pipeline.spec import MODEL_STAGES

pytestmark = pytest.mark.slow


def test_entry_point_prints_one_line_not_a_traceback(tmp_path: Path):
    env = {"PATH": "/usr/bin:/bin", "ONLY_CPU": "maybe", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pipeline.reference"], env=env, capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "config error: ONLY_CPU='maybe' is not valid: expected true or false (also 1/0, yes/no, on/off)")
    assert "Traceback" not in proc.stderr


def test_node_whose_request_timeout_exceeds_node_1s_internal_cap_exits_2_naming_both(course_data):
    # Node 1 refuses an /internal/answer timeout_s above its cap: such a node would start and then
    # fail every forward. It must refuse to start instead, with one line naming both limits.
    from tests.helpers import TEST_ENV, data_env
    from tools.local import free_ports
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **TEST_ENV, **data_env(course_data),
           "NODE_NUMBER": "1", "NODE_1_IP": f"127.0.0.1:{free_ports(1)[0]}", "REQUEST_TIMEOUT_S": "4000"}
    proc = subprocess.Popen([sys.executable, "-m", "services.node"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        # a refusal comes right after the imports (1.6 s here alone, 38 s niced on the loaded 2-core box)
        _, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate(timeout=30)
        pytest.fail(f"the node started with REQUEST_TIMEOUT_S=4000 instead of refusing:\n{stderr[-2000:]}")
    assert proc.returncode == 2, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("config error: REQUEST_TIMEOUT_S='4000' is not valid"), last
    assert "MAX_INTERNAL_TIMEOUT_S" in last and "Traceback" not in stderr


def test_a_worker_with_no_models_exits_2_naming_the_build_command_and_builds_nothing(course_data, tmp_path):
    from tests.helpers import TEST_ENV, data_env
    from tools.local import free_ports
    home = tmp_path / "no-standins"
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **TEST_ENV, **data_env(course_data), "NODE_NUMBER": "1",
           "NODE_1_IP": f"127.0.0.1:{free_ports(1)[0]}", "STANDIN_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-m", "services.node"], env=env, capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=240)
    assert proc.returncode == 2, proc.stderr[-2000:]
    command = f"build them with: python -m builders.standins --profile tiny --hf-home {home}"
    assert [line for line in proc.stderr.splitlines() if command in line], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not home.exists()


def test_node_with_several_bad_settings_prints_every_problem_one_line_each_and_exits_2():
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "NODE_NUMBER": "1", "ONLY_CPU": "maybe",
           "NPROBE": "0", "GATEWAY_MAX_JOINERS_PER_ID": "20"}
    proc = subprocess.run([sys.executable, "-m", "services.node"], env=env, capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "config error: ONLY_CPU='maybe' is not valid: expected true or false (also 1/0, yes/no, on/off)",
        "config error: NPROBE='0' is not valid: expected an integer from 1 to 65536",
        "config error: GATEWAY_MAX_JOINERS_PER_ID='20' is not valid: expected at most GATEWAY_MAX_JOINERS (16)"]


@pytest.mark.parametrize("node,imported", [(2, False), (1, True)])
def test_only_a_model_role_imports_torch_and_a_settings_error_imports_none(node, imported):
    """The index node never imports torch (memory and start time), and a bad setting is reported
    before any role is imported, so a misconfigured node exits at once."""
    probe = ("import sys, services.node; from pipeline.config import Settings; from services.roles import role_class; "
             "settings = Settings.from_env(); assert 'torch' not in sys.modules, 'services.node imported torch'; "
             "role_class(settings.cluster, settings.require_node_number()); print('torch' in sys.modules)")
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "NODE_NUMBER": str(node)}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(imported)


def test_huggingface_hub_warnings_reach_a_node_log_once():
    # huggingface_hub has a stderr handler of its own and also propagates: every warning (the hub's
    # retries among them) appeared twice, once bare and once formatted.
    script = ("from pipeline.config import Settings; from services.node import configure_logging; "
              "configure_logging(Settings.from_env({}), 1, True); import logging; "
              "logging.getLogger('huggingface_hub.utils._http').warning('hub-warning-marker')")
    proc = subprocess.run([sys.executable, "-c", script], env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "hub-warning-marker" in line]
    assert len(lines) == 1 and " node1 WARNING huggingface_hub" in lines[0], proc.stderr


@pytest.mark.parametrize("arg", ["--help", "-h", "help"])
def test_run_sh_help_lists_its_commands_and_needs_no_setup(arg):
    proc = subprocess.run(["bash", str(REPO_ROOT / "run.sh"), arg], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stderr == ""
    for command in ("setup", "test", "demo", "local", "models", "settings", "NODE_NUMBER=N ./run.sh"):
        assert command in proc.stdout


def test_run_sh_without_a_command_or_node_number_prints_the_help_and_exits_2():
    proc = subprocess.run(["bash", str(REPO_ROOT / "run.sh")], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "models" in proc.stderr and "NODE_NUMBER" in proc.stderr


def run_sh(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`./run.sh ARGS` as a process (its setup step is a no-op where .venv is installed, as for the suite)."""
    return subprocess.run(["bash", str(REPO_ROOT / "run.sh"), *args], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)


def test_run_sh_models_lists_each_missing_model_with_the_command_that_fetches_it_and_exits_1(tmp_path):
    proc = run_sh("models", env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1, proc.stderr
    assert f"Hugging Face cache: {tmp_path / 'hf' / 'hub'}" in proc.stdout
    assert "5 of 5 models missing" in proc.stdout
    for name in ALL_MODELS:  # each on a line of its own, the command alone after the list, to copy
        # each at the commit the nodes load it at (pipeline/models.py's MODEL_REVISIONS)
        pinned = rf"download {re.escape(name)} --revision {MODEL_REVISIONS[name]}$"
        assert re.search(rf"^  missing  {re.escape(name)} .*{pinned}", proc.stdout, re.M)
        assert re.search(rf"^  \S*(hf|huggingface-cli) {pinned}", proc.stdout, re.M)


def test_run_sh_settings_prints_the_effective_values_with_secrets_hidden_and_warns_of_a_misspelling():
    env = {"HF_HUB_OFFLINE": "1", "EMBED_MAX_BATCH": "8", "CLUSTER_TOKEN": "s3cret", "GENERTE_MAX_BATCH": "4"}
    proc = run_sh("settings", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split("=")[0]: line for line in proc.stdout.splitlines() if not line.startswith("#")}
    assert set(lines) == set(Settings.variables())
    assert re.fullmatch(r"EMBED_MAX_BATCH=8 +# set \(default: 16\)", lines["EMBED_MAX_BATCH"])
    assert re.fullmatch(r"CLUSTER_TOKEN=<hidden> +# set \(default: empty\)", lines["CLUSTER_TOKEN"])
    assert re.fullmatch(r"NPROBE= +# default", lines["NPROBE"]) and "s3cret" not in proc.stdout
    assert re.fullmatch(r"INDEX_MIN_RECALL=0.95 +# default", lines["INDEX_MIN_RECALL"])
    assert proc.stderr.splitlines() == ["warning: GENERTE_MAX_BATCH is not a setting this service reads (ignored); "
                                        "did you mean GENERATE_MAX_BATCH? (env.example lists them all)"]
    # What each stage computes in, resolved: PRECISION=auto is bfloat16 on a CPU with avx512_bf16 or AMX.
    auto = "bfloat16" if cpu_supports_bf16() else "float32"
    resolved = [line for line in proc.stdout.splitlines() if line.startswith("# ") and "PRECISION=" in line]
    assert len(resolved) == len(MODEL_STAGES)
    for stage, line in zip(MODEL_STAGES, resolved):
        assert re.fullmatch(rf"# {stage}: {auto} \(PRECISION=auto on a CPU with .+\)", line), line
    only = run_sh("settings", "--non-default", env=env)
    assert only.returncode == 0
    assert [line.split("=")[0] for line in only.stdout.splitlines() if not line.startswith("#")] == [
        "CLUSTER_TOKEN", "HF_HUB_OFFLINE", "EMBED_MAX_BATCH"]


def test_run_sh_settings_lists_every_bad_value_at_once_and_exits_2():
    proc = run_sh("settings", env={"ONLY_CPU": "maybe", "NPROBE": "0", "SEARCH_MAX_BATCH": "300"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "config error: ONLY_CPU='maybe' is not valid: expected true or false (also 1/0, yes/no, on/off)",
        "config error: NPROBE='0' is not valid: expected an integer from 1 to 65536",
        "config error: SEARCH_MAX_BATCH='300' is not valid: expected at most STAGE_MAX_QUEUE (256), "
        "or node 2 could never queue a batch"]


def test_run_sh_settings_refuses_the_removed_dtype_variables_naming_what_replaced_them():
    proc = run_sh("settings", env={"DTYPE": "float32", "GENERATE_DTYPE": "bfloat16", "PRECISION": "exact"})
    assert proc.returncode == 2 and proc.stdout == ""
    problems = proc.stderr.splitlines()
    assert len(problems) == 3
    assert problems[0].startswith("config error: DTYPE='float32' is not read any more: set PRECISION instead")
    assert problems[1].startswith("config error: GENERATE_DTYPE='bfloat16' is not read any more: "
                                  "set GENERATE_PRECISION instead")
    assert problems[2].startswith("config error: PRECISION='exact' is not valid: expected one of auto, ")
    assert "'exact' was removed: use auto" in problems[2]
