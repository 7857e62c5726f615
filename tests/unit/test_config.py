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


def test_channel_timeout_is_derived_from_the_request_timeout():
    from pipeline.config import CHANNEL_TIMEOUT_MARGIN_S
    s = Settings.from_env({"REQUEST_TIMEOUT_S": "10"})
    assert s.channel_timeout_s == 10 + CHANNEL_TIMEOUT_MARGIN_S > s.request_timeout_s
    assert Settings.from_env({}).channel_timeout_s > Settings.from_env({}).request_timeout_s


def test_hf_hub_offline_is_a_setting_and_offline_never_looks_at_the_hub():
    from pipeline.models import resolve_model_source
    assert Settings.from_env({"HF_HUB_OFFLINE": "1"}).hf_hub_offline is True
    assert Settings.from_env({}).hf_hub_offline is False
    with pytest.raises(ConfigError, match=r"^HF_HUB_OFFLINE='maybe' is not valid: expected true or false"):
        Settings.from_env({"HF_HUB_OFFLINE": "maybe"})

    def reachable():
        raise AssertionError("an offline node must not contact the hub")

    hub = resolve_model_source(Settings.from_env({"HF_HUB_OFFLINE": "1", "MODEL_SOURCE": "hub"}),
                               reachable=reachable)
    assert hub.kind == "hub" and hub.local_files_only


def test_worker_config_takes_only_what_the_worker_reads():
    from pipeline.spec import WORKER_STAGES
    from services.roles.worker import worker_config
    s = Settings.from_env({"GENERATE_MAX_BATCH": "4", "EMBED_CACHE_SIZE": "7"})
    cfg = worker_config(s)
    assert set(cfg.batching) == set(WORKER_STAGES) and cfg.embed_cache_size == 7
    assert cfg.continuous is not None and cfg.continuous.max_seqs == 4
    assert worker_config(s.replace(generate_mode="static")).continuous is None


def test_default_http_threads_leave_spare_threads_beyond_the_gateway_limit():
    from services.lifecycle import Lifecycle
    from services.roles import role_class
    from services.roles.base import SPARE_HTTP_THREADS
    s = Settings.from_env({"GATEWAY_MAX_IN_FLIGHT": "10"})
    life = Lifecycle("t", 0.0)
    assert role_class(0)(s, 0, life).http_threads() == 10 + SPARE_HTTP_THREADS
    assert role_class(1)(s, 1, life).http_threads() == 10 + SPARE_HTTP_THREADS
    assert role_class(2)(s, 2, life).http_threads() == SPARE_HTTP_THREADS
    assert role_class(2)(s.replace(waitress_threads=5), 2, life).http_threads() == 5


def test_settings_that_must_agree_are_checked_in_one_line_naming_both():
    from pipeline.config import MAX_INTERNAL_TIMEOUT_S
    assert Settings.from_env({"REQUEST_TIMEOUT_S": str(MAX_INTERNAL_TIMEOUT_S)}).request_timeout_s == MAX_INTERNAL_TIMEOUT_S
    cases = [({"REQUEST_TIMEOUT_S": "4000"}, r"^REQUEST_TIMEOUT_S='4000' is not valid: .*MAX_INTERNAL_TIMEOUT_S"),
             ({"GATEWAY_MAX_JOINERS_PER_ID": "9", "GATEWAY_MAX_JOINERS": "8"},
              r"^GATEWAY_MAX_JOINERS_PER_ID='9' is not valid: expected at most GATEWAY_MAX_JOINERS \(8\)$")]
    for env, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            Settings.from_env(env)
        assert "\n" not in str(err.value)


def test_joiner_caps_default_below_node_0s_spare_http_threads(tmp_path: Path):
    from services.roles.base import SPARE_HTTP_THREADS
    from services.roles.gateway import GatewayRole
    (tmp_path / "documents.db").touch()
    s = Settings.from_env({"DOCUMENTS_DIR": str(tmp_path)})
    assert (s.gateway_max_joiners_per_id, s.gateway_max_joiners) == (8, 16)
    GatewayRole.check_settings(s)
    with pytest.raises(ConfigError, match=r"^GATEWAY_MAX_JOINERS='32' is not valid: .*spare HTTP threads"):
        GatewayRole.check_settings(s.replace(gateway_max_joiners=SPARE_HTTP_THREADS))
    GatewayRole.check_settings(s.replace(gateway_max_joiners=SPARE_HTTP_THREADS, waitress_threads=200))
