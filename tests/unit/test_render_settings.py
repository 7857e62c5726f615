"""tools/render_settings.py: env.example and the Kubernetes configmap are generated from the settings
table, and the committed copies are exactly what it generates."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import tools.render_settings as rs
from pipeline.config import REPO_ROOT, Settings


def test_the_committed_files_are_what_the_settings_table_generates():
    assert rs.stale() == [], f"run `{rs.COMMAND}` and commit the result"
    assert rs.main(["--check"]) == 0


def test_check_names_each_stale_copy_and_write_brings_it_in_step(tmp_path: Path, capsys):
    assert rs.stale(tmp_path) == ["env.example", "deploy/k8s/configmap.yaml"]  # missing counts as stale
    assert rs.write(tmp_path) == ["env.example", "deploy/k8s/configmap.yaml"]
    assert rs.stale(tmp_path) == [] and rs.write(tmp_path) == []
    assert (tmp_path / "env.example").read_text() == (REPO_ROOT / "env.example").read_text()
    config = tmp_path / "deploy/k8s/configmap.yaml"
    config.write_text(config.read_text().replace('FAISS_MMAP: "true"', 'FAISS_MMAP: "false"'))
    assert rs.stale(tmp_path) == ["deploy/k8s/configmap.yaml"]


def test_both_files_say_they_are_generated_and_by_which_command():
    for path in rs.OUTPUTS:
        head = (REPO_ROOT / path).read_text()[:1000]
        assert "python -m tools.render_settings --write" in head and "do not edit" in head, path


def test_env_example_gives_each_variable_its_help_and_default_under_its_section():
    text = rs.render_env_example()
    sections = re.findall(r"^# ==== (.+)$", text, flags=re.M)
    titles = list(dict.fromkeys(title for title, _ in Settings.table()))
    assert sections == titles and len(titles) >= 10
    for name, meta in Settings.variables().items():
        assert f"\n# {meta['help']}\n{name}={meta['default']}\n" in text, name
    assert "\n# NODE_<n>_IP: host:port of node n" in text and "\n# NODE_3_IP=127.0.0.1:8003\n" in text


def written_default(name: str) -> str:
    """A variable's default as the table writes it (a path as given, not resolved)."""
    return Settings.variables()[name]["default"] if name in Settings.variables() else Settings.default_of(name)


def test_the_configmap_carries_every_shared_setting_at_its_default_except_the_wiring():
    text = rs.render_configmap()
    data = yaml.safe_load(text)["data"]
    shared = [name for name in Settings.variables() if name not in rs.K8S_PER_POD and name != "CLUSTER_TOKEN"]
    assert [name for name in data if not name.startswith("NODE_3")] == shared
    for name, value in data.items():
        wiring = rs.K8S_WIRING.get(name)
        assert value == (wiring.value if wiring else written_default(name)), name
        if wiring:
            assert re.search(rf'^  {name}: .*# cluster wiring \(default "{re.escape(written_default(name))}"\)$',
                             text, flags=re.M), name
    assert "CLUSTER_TOKEN" not in data and "NODE_NUMBER" not in data  # a secret, and per pod


def test_a_setting_added_to_the_table_appears_in_both_files(monkeypatch):
    title, meta = next(Settings.table())
    extra = {**meta, "env": "NEW_KNOB", "default": "7", "help": "a knob just added"}
    rows = [*Settings.table(), (title, extra)]
    monkeypatch.setattr(Settings, "table", staticmethod(lambda: iter(rows)))
    monkeypatch.setattr(Settings, "default_of", staticmethod(lambda name: "7"))
    assert "\n# a knob just added\nNEW_KNOB=7\n" in rs.render_env_example()
    assert yaml.safe_load(rs.render_configmap())["data"]["NEW_KNOB"] == "7"


def test_wiring_a_variable_that_is_not_a_setting_is_refused(monkeypatch):
    monkeypatch.setitem(rs.K8S_WIRING, "NODE_NUBMER", rs.Wiring("1"))
    with pytest.raises(ValueError, match="NODE_NUBMER"):
        rs.render_configmap()
