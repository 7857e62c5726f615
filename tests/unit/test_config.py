"""Settings: typed values, defaults, one line per problem (all at once), env.example agreement,
effective settings, misspelt variables."""
import dataclasses
import re
from pathlib import Path

import pytest

from pipeline.config import REPO_ROOT, Address, ConfigError, Settings
from pipeline.spec import MODEL_STAGES


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
    assert s.cluster.total_nodes == 3 and s.cluster.node_number is None
    assert s.cluster.node_1_ip == Address("127.0.0.1", 8001)
    assert s.cluster.worker_nodes == () and s.cluster.rotation == (0, 1)  # empty: every worker
    assert s.models.only_cpu is False and s.index.nprobe is None and s.index.min_recall == 0.95
    assert s.batching("embed").max_batch >= 1 and s.generate.max_batch >= 1
    with pytest.raises(KeyError):
        s.batching("generate")  # continuous batching: no batch window
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.index.nprobe = 1  # type: ignore[misc]  # immutable


def test_values_from_env():
    s = Settings.from_env({"NODE_NUMBER": "1", "NODE_1_IP": "10.1.2.3:9000", "CLUSTER_TOKEN": "t", "ONLY_CPU": "TRUE",
                           "GENERATE_MAX_BATCH": "4", "RERANK_PRECISION": "float32", "WORKER_NODES": "1"})
    assert s.cluster.node_number == 1 and s.cluster.node_1_ip.url == "http://10.1.2.3:9000"
    assert s.models.only_cpu is True and s.generate.max_batch == 4 and s.cluster.worker_nodes == (1,)
    assert s.stage_precision("rerank") == "float32" and s.stage_precision("embed") == "auto"


def test_batches_close_by_count_and_window_alone():
    """Token budgets and the prefix cache were measured, did not pay, and were removed
    (docs/performance.md): none of their variables is read."""
    from pipeline.config.typos import misspelt_variables
    names = set(Settings.variables())
    assert not {n for n in names if n.endswith("_MAX_BATCH_TOKENS")} and "GENERATE_PREFIX_CACHE" not in names
    assert Settings.from_env({"RERANK_MAX_BATCH_TOKENS": "6000"}) == Settings.from_env({})
    # Still set somewhere: the node says it is ignored.
    assert "RERANK_MAX_BATCH_TOKENS is not a setting" in " ".join(misspelt_variables({"RERANK_MAX_BATCH_TOKENS": "1"}))


@pytest.mark.parametrize("name,value,accepted", [
    ("NODE_NUMBER", "abc", "an integer from 0 to 63"),
    ("NODE_NUMBER", "5", "a node below TOTAL_NODES (3), from 0 to 2"),
    ("NODE_1_IP", "10.0.0.5", "host:port"),
    ("NODE_0_IP", "host:99999", "host:port"),
    ("ONLY_CPU", "maybe", "true or false"),
    ("MODEL_SOURCE", "cloud", "one of auto, hub, standin"),
    ("GENERATE_MAX_BATCH", "0", "an integer from 1"),
    ("REQUEST_TIMEOUT_S", "-1", "a number > 0"),
    ("WORKER_NODES", "0,0", "distinct node numbers"),
    ("PRECISION", "int8", "one of auto"),
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
    with pytest.raises(ConfigError, match=r"^FAISS_INDEX_PATH='.*nope.bin' is not valid: the index file is missing"):
        s.require_index_file(2)
    with pytest.raises(ConfigError, match=r"^FAISS_INDEX_PATH='.*nope.bin' is not valid: the index file is missing"):
        s.require_index_files()
    with pytest.raises(ConfigError, match=r"^DOCUMENTS_DIR=.*documents.db"):
        s.require_documents()


def test_channel_timeout_is_derived_from_the_request_timeout():
    from pipeline.config.sections import CHANNEL_TIMEOUT_MARGIN_S
    s = Settings.from_env({"REQUEST_TIMEOUT_S": "10"})
    assert s.channel_timeout_s == 10 + CHANNEL_TIMEOUT_MARGIN_S > s.limits.request_timeout_s
    assert Settings.from_env({}).channel_timeout_s > Settings.from_env({}).limits.request_timeout_s


def test_hf_hub_offline_is_a_setting_and_offline_never_looks_at_the_hub():
    from pipeline.models import resolve_model_source
    assert Settings.from_env({"HF_HUB_OFFLINE": "1"}).models.hf_hub_offline is True
    assert Settings.from_env({}).models.hf_hub_offline is False
    with pytest.raises(ConfigError, match=r"^HF_HUB_OFFLINE='maybe' is not valid: expected true or false"):
        Settings.from_env({"HF_HUB_OFFLINE": "maybe"})

    def reachable():
        raise AssertionError("an offline node must not contact the hub")

    hub = resolve_model_source(Settings.from_env({"HF_HUB_OFFLINE": "1", "MODEL_SOURCE": "hub"}),
                               missing=lambda: [], reachable=reachable)
    assert hub.kind == "hub" and hub.local_files_only


def test_worker_config_takes_only_what_the_worker_reads():
    from pipeline.spec import WORKER_STAGES
    from services.roles.worker.role import worker_config
    s = Settings.from_env({"GENERATE_MAX_BATCH": "4", "EMBED_CACHE_SIZE": "7"})
    cfg = worker_config(s)
    assert set(cfg.batching) == set(WORKER_STAGES) - {"generate"} and cfg.embed_cache_size == 7
    assert cfg.continuous.max_batch == 4
    assert worker_config(Settings.from_env({"GENERATE_KV_CACHE_TOKENS": "20000"})).continuous.kv_cache_tokens == 20000
    assert worker_config(s, "cuda").batching["rerank"] == s.batching("rerank", "cuda")  # the models' device's


def test_default_http_threads_leave_spare_threads_beyond_the_gateway_limit():
    from services.roles import role_class
    from services.roles.base import SPARE_HTTP_THREADS
    from services.server.lifecycle import Lifecycle
    s = Settings.from_env({"GATEWAY_MAX_IN_FLIGHT": "10"})
    life = Lifecycle("t", 0.0)
    assert role_class(s.cluster, 0)(s, 0, life).http_threads() == 10 + SPARE_HTTP_THREADS
    assert role_class(s.cluster, 1)(s, 1, life).http_threads() == 10 + SPARE_HTTP_THREADS
    assert role_class(s.cluster, 2)(s, 2, life).http_threads() == SPARE_HTTP_THREADS
    assert role_class(s.cluster, 2)(Settings.from_env({"WAITRESS_THREADS": "5"}), 2, life).http_threads() == 5


def test_settings_that_must_agree_are_checked_in_one_line_naming_both():
    from pipeline.config.checks import MAX_INTERNAL_TIMEOUT_S
    assert Settings.from_env({"REQUEST_TIMEOUT_S": str(MAX_INTERNAL_TIMEOUT_S)}).limits.request_timeout_s == MAX_INTERNAL_TIMEOUT_S
    cases = [({"REQUEST_TIMEOUT_S": "4000"}, r"^REQUEST_TIMEOUT_S='4000' is not valid: .*MAX_INTERNAL_TIMEOUT_S"),
             ({"GATEWAY_MAX_JOINERS_PER_ID": "9", "GATEWAY_MAX_JOINERS": "8"},
              r"^GATEWAY_MAX_JOINERS_PER_ID='9' is not valid: expected at most GATEWAY_MAX_JOINERS \(8\)$")]
    for env, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            Settings.from_env(env)
        assert "\n" not in str(err.value)


def test_joiner_caps_default_below_node_0s_spare_http_threads(tmp_path: Path):
    from services.roles.base import SPARE_HTTP_THREADS
    from services.roles.gateway.role import GatewayRole
    (tmp_path / "documents.db").touch()
    s = Settings.from_env({"DOCUMENTS_DIR": str(tmp_path)})
    assert (s.gateway.max_joiners_per_id, s.gateway.max_joiners) == (8, 16)
    GatewayRole.check_settings(s)
    with pytest.raises(ConfigError, match=r"^GATEWAY_MAX_JOINERS='32' is not valid: .*spare HTTP threads"):
        GatewayRole.check_settings(Settings.from_env({"DOCUMENTS_DIR": str(tmp_path), "GATEWAY_MAX_JOINERS": str(SPARE_HTTP_THREADS)}))
    GatewayRole.check_settings(Settings.from_env({"DOCUMENTS_DIR": str(tmp_path), "WAITRESS_THREADS": "200",
                                                 "GATEWAY_MAX_JOINERS": str(SPARE_HTTP_THREADS)}))


# ---------------------------------------------------------------- every problem at once


def test_every_bad_value_and_every_disagreement_is_reported_at_once_one_line_each():
    env = {"NODE_NUMBER": "abc", "ONLY_CPU": "maybe", "GATEWAY_MAX_JOINERS_PER_ID": "20",
           "REQUEST_TIMEOUT_S": "4000"}
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    problems = err.value.problems
    # what every entry point prints: each problem on its own line, each prefixed
    assert f"config error: {err.value}".splitlines() == [f"config error: {p}" for p in problems]
    # first the values that do not parse (declaration order), then the checks between values
    assert [p.split("=")[0] for p in problems] == [
        "NODE_NUMBER", "ONLY_CPU", "REQUEST_TIMEOUT_S", "GATEWAY_MAX_JOINERS_PER_ID"]
    assert problems[2].startswith("REQUEST_TIMEOUT_S='4000' is not valid: expected at most 3600")
    assert problems[0] == "NODE_NUMBER='abc' is not valid: expected an integer from 0 to 63"


def test_a_check_between_values_is_skipped_when_one_of_its_values_did_not_parse():
    # GATEWAY_MAX_JOINERS did not parse: comparing the per-id cap with its default would mislead.
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"GATEWAY_MAX_JOINERS": "many", "GATEWAY_MAX_JOINERS_PER_ID": "20"})
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith("GATEWAY_MAX_JOINERS='many'")


def test_a_bad_secret_is_reported_without_its_value():
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"CLUSTER_TOKEN": "has space", "NPROBE": "0"})
    assert err.value.problems[0] == "CLUSTER_TOKEN='<hidden>' is not valid: expected printable ASCII without " \
                                    "spaces (or empty to turn the check off)"
    assert "has space" not in str(err.value)


# ---------------------------------------------------------------- effective settings


def test_effective_settings_are_the_strings_that_set_them_with_secrets_hidden():
    s = Settings.from_env({"CLUSTER_TOKEN": "s3cret", "EMBED_MAX_BATCH": "8", "ONLY_CPU": "YES",
                           "WORKER_NODES": "1", "IDEMPOTENCY_TTL_S": "0.25", "NODE_1_IP": "10.0.0.5:9000"})
    shown = s.effective()
    assert list(shown) == list(Settings.variables())
    assert shown["CLUSTER_TOKEN"] == "<hidden>" and "s3cret" not in str(shown)
    assert (shown["EMBED_MAX_BATCH"], shown["ONLY_CPU"], shown["WORKER_NODES"]) == ("8", "true", "1")
    assert (shown["IDEMPOTENCY_TTL_S"], shown["REQUEST_TIMEOUT_S"], shown["NODE_NUMBER"]) == ("0.25", "280", "")
    assert shown["NODE_1_IP"] == "10.0.0.5:9000"
    assert Settings.from_env(shown | {"CLUSTER_TOKEN": "s3cret"}) == s  # they parse back to the same settings
    assert s.non_defaults() == {"NODE_1_IP": "10.0.0.5:9000", "WORKER_NODES": "1", "CLUSTER_TOKEN": "<hidden>",
                                "ONLY_CPU": "true", "EMBED_MAX_BATCH": "8", "IDEMPOTENCY_TTL_S": "0.25"}
    assert Settings.from_env({"ONLY_CPU": "false"}).non_defaults() == {}


def test_python_m_pipeline_config_prints_each_variable_and_whether_it_is_the_default(monkeypatch, capsys):
    from pipeline.config import __main__ as config
    for name in Settings.variables():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EMBED_MAX_BATCH", "8")
    monkeypatch.setenv("FAISS_MMAP", "true")
    monkeypatch.setenv("CLUSTER_TOKEN", "s3cret")
    assert config.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if not line.startswith("#")]) == len(Settings.variables())
    lines = {line.split("=")[0]: line for line in out}
    # Then what each model stage computes in, resolved as a node resolves it (no model loaded).
    stages = out.index("# what each model stage computes in here:")
    assert [line.split(":")[0] for line in out[stages + 1:stages + 6]] == [f"# {stage}" for stage in MODEL_STAGES]
    assert re.fullmatch(r"EMBED_MAX_BATCH=8 +# set \(default: 16\)", lines["EMBED_MAX_BATCH"])
    assert re.fullmatch(r"FAISS_MMAP=true +# set, equal to the default", lines["FAISS_MMAP"])
    assert re.fullmatch(r"TOTAL_NODES=3 +# default", lines["TOTAL_NODES"])
    assert re.fullmatch(r"CLUSTER_TOKEN=<hidden> +# set \(default: empty\)", lines["CLUSTER_TOKEN"])
    assert config.main(["--non-default"]) == 0
    assert [line.split("=")[0] for line in capsys.readouterr().out.splitlines()] == ["CLUSTER_TOKEN", "EMBED_MAX_BATCH"]
    for name in ("EMBED_MAX_BATCH", "CLUSTER_TOKEN"):
        monkeypatch.delenv(name)
    assert config.main(["--non-default"]) == 0
    assert capsys.readouterr().out == "# every setting is at its default\n"


def test_python_m_pipeline_config_shows_the_served_versions_index_and_recall_per_shard(monkeypatch, capsys, tmp_path):
    from builders.data import build_course
    from pipeline.config import __main__ as config
    for name in Settings.variables():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAISS_INDEX_PATH", str(tmp_path / "v1" / "faiss_index.bin"))
    assert config.main([]) == 0
    assert f"# no data version at FAISS_INDEX_PATH's folder {tmp_path / 'v1'}" in capsys.readouterr().out
    manifest = build_course(tmp_path / "v1", 3000, seed=0, progress=False, batch_size=1000, shards=2).manifest
    recall = manifest.index["recall"]
    assert config.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    shown = out[out.index(f"# data version v1 (course, 3000 documents) in {tmp_path / 'v1'}:") + 1:]
    assert shown[0].startswith(f"#   index {manifest.index['spec']}, 2 shard(s), sharding hash")
    per_shard = " ".join(f"{n}:{r:.4f}" for n, r in enumerate(recall["shards"]))
    assert len(recall["shards"]) == 2
    assert shown[1] == (f"#   recall@10 {recall['overall']:.4f} overall at nprobe {recall['params']['nprobe']} "
                        f"on {recall['queries']} queries; per shard {per_shard}; floor {recall['floor']:g}"
                        + (" (accepted below it)" if recall["accepted_below_floor"] else ""))


def test_python_m_pipeline_config_prints_every_problem_and_exits_2(monkeypatch, capsys):
    from pipeline.config import __main__ as config
    monkeypatch.setenv("ONLY_CPU", "maybe")
    monkeypatch.setenv("NPROBE", "0")
    assert config.main([]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["config error: ONLY_CPU='maybe' is not valid: expected true or false (also 1/0, yes/no, on/off)",
                   "config error: NPROBE='0' is not valid: expected an integer from 1 to 65536"]


# ---------------------------------------------------------------- misspelt variables


@pytest.mark.parametrize("typo,meant", [
    ("GENERTE_MAX_BATCH", "GENERATE_MAX_BATCH"),
    ("EMBED_MAX_BACH", "EMBED_MAX_BATCH"),
    ("RERANK_BATCH", "RERANK_MAX_BATCH"),  # one of our stage words
    ("SENTIMENT_MAXWAIT", "SENTIMENT_MAX_WAIT_MS"),
    ("FOO_PRECISION", None),  # one of our endings: some *_PRECISION is named
    ("HF_HUB_OFLINE", "HF_HUB_OFFLINE"),  # huggingface's prefix, but very close to ours
    ("REQEST_TIMEOUT_S", "REQUEST_TIMEOUT_S"),
    ("NODE_01_IP", None),  # not one of NODE_<n>_IP (no leading zeros)
])
def test_a_variable_that_looks_like_ours_gets_a_warning_naming_the_closest(typo, meant):
    from pipeline.config.typos import misspelt_variables
    warnings = misspelt_variables({typo: "1", "EMBED_MAX_BATCH": "4"})
    assert len(warnings) == 1 and warnings[0].startswith(f"{typo} is not a setting this service reads")
    suggested = re.search(r"did you mean (\w+)\?", warnings[0]).group(1)
    assert suggested in Settings.variables()
    if meant:
        assert suggested == meant


def test_other_softwares_variables_get_no_warning():
    from pipeline.config.typos import misspelt_variables
    foreign = ["PATH", "HOME", "USER", "LANG", "PWD", "SHELL", "TERM", "TMPDIR", "HF_HOME", "HF_ENDPOINT", "HF_TOKEN",
               "HF_HUB_CACHE", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT",
               "TRANSFORMERS_OFFLINE", "TRANSFORMERS_NO_ADVISORY_WARNINGS", "TOKENIZERS_PARALLELISM", "TORCH_HOME",
               "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "OTEL_SERVICE_NAME",
               "OTEL_EXPORTER_OTLP_ENDPOINT", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST",
               "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "NODE_OPTIONS", "NODE_EXTRA_CA_CERTS", "VIRTUAL_ENV",
               "DEMO_DIR", "DEMO_DOCS", "LD_LIBRARY_PATH", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "LOGNAME",
               "PIP_FIND_LINKS", "HOSTNAME", *Settings.variables()]
    assert misspelt_variables({name: "x" for name in foreign}) == []


# ---------------------------------------------------------------- topology: N workers, index shards and replicas

def test_the_default_topology_is_the_three_node_design():
    c = Settings.from_env({}).cluster
    assert (c.workers, c.rotation, c.index_nodes, c.index_shards) == ((0, 1), (0, 1), (2,), 1)
    assert [c.role_of(n) for n in c.nodes] == ["gateway", "worker", "index"]
    assert c.bind_address(1) == c.node_address(1)


def test_more_workers_shards_and_replicas_from_the_environment():
    c = Settings.from_env({"TOTAL_NODES": "7", "INDEX_NODES": "4,5,6", "INDEX_SHARDS": "2", "NODE_4_IP": "idx-a:9000",
                           "BIND_HOST": "0.0.0.0"}).cluster
    assert c.workers == c.rotation == (0, 1, 2, 3)
    assert [c.role_of(n) for n in c.nodes] == ["gateway", "worker", "worker", "worker", "index", "index", "index"]
    assert [c.served_shard(n) for n in c.index_nodes] == [0, 1, 0] and c.replicas(0) == (4, 6) and c.replicas(1) == (5,)
    assert str(c.node_address(4)) == "idx-a:9000" and str(c.node_address(5)) == "127.0.0.1:8005"
    assert str(c.bind_address(4)) == "0.0.0.0:9000"


@pytest.mark.parametrize("env,message", [
    ({"INDEX_NODES": "0,2"}, "INDEX_NODES='0,2' is not valid: node 0 is the gateway and a worker"),
    ({"INDEX_NODES": "3"}, "INDEX_NODES='3' is not valid: node 3 is not below TOTAL_NODES (3)"),
    ({"INDEX_SHARDS": "2"}, "INDEX_SHARDS='2' is not valid: expected at most the 1 INDEX_NODES (2)"),
    ({"WORKER_NODES": "0,2"}, "WORKER_NODES='0,2' is not valid: node 2 is an index node (INDEX_NODES=2)"),
    ({"TOTAL_NODES": "4", "WORKER_NODES": "5"}, "WORKER_NODES='5' is not valid: node 5 is not below TOTAL_NODES (4)"),
    ({"NODE_3_IP": "127.0.0.1:9003"}, "NODE_3_IP is set but TOTAL_NODES is 3"),
    ({"NODE_NUMBER": "3"}, "NODE_NUMBER='3' is not valid: expected a node below TOTAL_NODES (3)"),
    ({"NODE_1_IP": "127.0.0.1:8000"}, "NODE_1_IP='127.0.0.1:8000' is not valid: node 0 has the same address"),
    ({"TOTAL_NODES": "4", "NODE_3_IP": "nope"}, "NODE_3_IP='nope' is not valid: expected host:port"),
    ({"BIND_HOST": "10.0.0.1:80"}, "BIND_HOST='10.0.0.1:80' is not valid: expected a host name or IP address without a port"),
    ({"TOTAL_NODES": "65"}, "TOTAL_NODES='65' is not valid: expected an integer from 3 to 64"),
])
def test_a_topology_that_cannot_work_is_refused_naming_the_variable_and_the_rule(env, message):
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert message in str(err.value), str(err.value)


@pytest.mark.parametrize("env", [
    {"NODE_NUMBER": "1", "BIND_HOST": "0.0.0.0"},
    {"NODE_NUMBER": "2", "NODE_2_IP": "rag-index-0.rag-index:8000"},
    {"NODE_NUMBER": "0", "NODE_0_IP": "10.0.0.5:8000"},
])
def test_a_node_listening_beyond_loopback_without_a_cluster_token_refuses_to_start(env):
    with pytest.raises(ConfigError, match=r"CLUSTER_TOKEN='' is not valid: node \d listens on .* beyond loopback"):
        Settings.from_env(env)
    assert Settings.from_env({**env, "CLUSTER_TOKEN": "s3cret"}).cluster.cluster_token == "s3cret"


@pytest.mark.parametrize("env", [{}, {"NODE_NUMBER": "1"}, {"NODE_NUMBER": "1", "BIND_HOST": "127.0.0.2"},
                                 {"NODE_NUMBER": "0", "NODE_0_IP": "localhost:8000"},
                                 {"BIND_HOST": "0.0.0.0"}])  # no node to start: `./run.sh settings`
def test_a_loopback_node_or_no_node_needs_no_cluster_token(env):
    assert Settings.from_env(env).cluster.cluster_token == ""


def test_a_numbered_node_address_is_a_setting_not_a_typo_and_shows_in_the_effective_settings():
    from pipeline.config.typos import misspelt_variables
    env = {"TOTAL_NODES": "4", "NODE_3_IP": "10.0.0.9:8000"}
    assert misspelt_variables(env) == []
    assert misspelt_variables({"NODE_3_IPP": "x"}) != []  # not one of the family: still a typo
    shown = Settings.from_env(env).effective()
    assert shown["NODE_3_IP"] == "10.0.0.9:8000" and "NODE_<n>_IP" not in shown


def test_an_index_node_needs_its_own_shard_file_and_no_files_of_another_shard_count(tmp_path: Path):
    from pipeline.shards import shard_path
    index = tmp_path / "faiss_index.bin"
    env = {"TOTAL_NODES": "5", "INDEX_NODES": "3,4", "INDEX_SHARDS": "2", "FAISS_INDEX_PATH": str(index)}
    s = Settings.from_env(env)
    shard_path(index, 1, 2).write_bytes(b"x")
    assert s.require_index_file(4) == shard_path(index, 1, 2)
    with pytest.raises(ConfigError, match=r"INDEX_SHARDS=2 is not valid: shard 0 of 2 is missing"):
        s.require_index_file(3)
    with pytest.raises(ConfigError, match=r"shard 0 of 2 is missing"):
        s.require_index_files()
    shard_path(index, 0, 3).write_bytes(b"x")  # left by a 3-shard build: the count disagrees
    with pytest.raises(ConfigError, match=r"is shard 0 of a 3-shard build, but INDEX_SHARDS=2"):
        s.require_index_file(4)


def test_the_settings_command_describes_a_five_node_topology_with_shards_and_replicas(monkeypatch, capsys):
    from pipeline.config.__main__ import main
    for name in Settings.variables():
        monkeypatch.delenv(name, raising=False)
    env = {"TOTAL_NODES": "5", "INDEX_NODES": "2,3,4", "INDEX_SHARDS": "2", "NODE_3_IP": "10.0.0.3:8000",
           "NODE_4_IP": "127.0.0.1:8004"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    c = Settings.from_env(env).cluster
    assert c.replicas(0) == (2, 4) and c.replicas(1) == (3,)  # two shards, shard 0 on two replicas
    assert main([]) == 0
    lines = {line.split("=", 1)[0]: line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")}
    assert lines["NODE_3_IP"].endswith("# set (default: 127.0.0.1:8003)")
    assert lines["NODE_4_IP"].endswith("# set, equal to the default")
    assert lines["TOTAL_NODES"].endswith("# set (default: 3)")
    assert main(["--non-default"]) == 0
    changed = [line.split("=", 1)[0] for line in capsys.readouterr().out.splitlines()]
    assert changed == ["TOTAL_NODES", "NODE_3_IP", "INDEX_NODES", "INDEX_SHARDS"]


def test_a_numbered_variable_has_a_default_per_number():
    assert Settings.default_of("NODE_3_IP") == "127.0.0.1:8003" and Settings.default_of("NODE_1_IP") == "127.0.0.1:8001"
    assert Settings.default_of("TOTAL_NODES") == "3"
    with pytest.raises(KeyError):
        Settings.default_of("NODE_2_IPS")


def test_an_empty_rerank_max_batch_takes_the_devices_and_a_set_one_holds_on_every_device():
    from pipeline.config.settings import RERANK_MAX_BATCH_BY_DEVICE
    defaults = Settings.from_env({})
    assert [defaults.batching("rerank", d).max_batch for d in ("cpu", "cuda")] == [RERANK_MAX_BATCH_BY_DEVICE[d]
                                                                                  for d in ("cpu", "cuda")]
    assert RERANK_MAX_BATCH_BY_DEVICE["cpu"] == 1 < RERANK_MAX_BATCH_BY_DEVICE["cuda"]
    chosen = Settings.from_env({"RERANK_MAX_BATCH": "3"})
    assert chosen.batching("rerank", "cpu").max_batch == chosen.batching("rerank", "cuda").max_batch == 3
    assert defaults.batching("embed", "cuda").max_batch == defaults.embed.max_batch
