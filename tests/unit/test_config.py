"""Settings: typed values, defaults, one-line errors, env.example agreement."""
import re
from pathlib import Path

import pytest

from pipeline.config import REPO_ROOT, Address, ConfigError, Settings


def env_example_names() -> list[str]:
    text = (REPO_ROOT / "env.example").read_text()
    return re.findall(r"^([A-Z][A-Z0-9_]*)=", text, flags=re.M)


def test_env_example_names_exactly_the_settings_variables():
    names = env_example_names()
    assert len(names) == len(set(names)), "a variable is listed twice in env.example"
    assert names == list(Settings.variables())


def test_env_example_defaults_match_settings():
    text = (REPO_ROOT / "env.example").read_text()
    for name, meta in Settings.variables().items():
        assert re.search(rf"^{name}={re.escape(meta['default'])}$", text, flags=re.M), name


def test_defaults_parse_and_are_typed():
    s = Settings.from_env({})
    assert s.total_nodes == 3 and s.node_number is None
    assert s.node_1_ip == Address("127.0.0.1", 8001)
    assert s.worker_nodes == (0, 1)
    assert s.only_cpu is False and s.nprobe == 64
    assert s.batching("generate").max_size >= 1
    with pytest.raises(Exception):
        s.nprobe = 1  # immutable


def test_values_from_env():
    s = Settings.from_env({"NODE_NUMBER": "1", "NODE_1_IP": "10.1.2.3:9000", "ONLY_CPU": "TRUE",
                           "GENERATE_MAX_BATCH": "4", "RERANK_DTYPE": "float32", "WORKER_NODES": "1"})
    assert s.node_number == 1 and s.node_1_ip.url == "http://10.1.2.3:9000"
    assert s.only_cpu is True and s.generate_max_batch == 4 and s.worker_nodes == (1,)
    assert s.stage_dtype("rerank") == "float32" and s.stage_dtype("embed") == "auto"


@pytest.mark.parametrize("name,value,accepted", [
    ("NODE_NUMBER", "abc", "an integer from 0 to 2"),
    ("NODE_NUMBER", "5", "an integer from 0 to 2"),
    ("NODE_1_IP", "10.0.0.5", "host:port"),
    ("NODE_0_IP", "host:99999", "host:port"),
    ("ONLY_CPU", "maybe", "true or false"),
    ("MODEL_SOURCE", "cloud", "one of auto, hub, standin"),
    ("GENERATE_MAX_BATCH", "0", "an integer from 1"),
    ("REQUEST_TIMEOUT_S", "-1", "a number > 0"),
    ("WORKER_NODES", "0,0", "distinct node numbers"),
    ("DTYPE", "int8", "one of auto"),
])
def test_bad_value_gives_one_line_naming_variable_value_and_accepted(name, value, accepted):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({name: value})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{name}={value!r}")
    assert accepted in message


def test_missing_index_file_and_documents(tmp_path: Path):
    s = Settings.from_env({"FAISS_INDEX_PATH": str(tmp_path / "nope.bin"), "DOCUMENTS_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"^FAISS_INDEX_PATH='.*nope.bin' is not valid: expected an existing"):
        s.require_index_file()
    with pytest.raises(ConfigError, match=r"^DOCUMENTS_DIR=.*documents.db"):
        s.require_documents()
