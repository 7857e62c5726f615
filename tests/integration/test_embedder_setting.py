"""A worker process whose EMBEDDER_MODEL gives vectors of another dimension than the data version's refuses it
before its models load: exit 2, one line naming both embedders, the dimensions and the variable."""
from __future__ import annotations

import json

import pytest

from tests.integration.test_data_versions import node_env, run_node
from tests.unit.test_embedder_setting import standin_folder

pytestmark = pytest.mark.slow


def test_a_worker_refuses_a_version_built_by_another_embedder_naming_embedder_model(support_data, model_source,
                                                                                      tmp_path):
    narrow = standin_folder(model_source, tmp_path / "narrow", dense=False)  # the stand-in without its projection
    hidden = json.loads((narrow / "config.json").read_text())["hidden_size"]
    code, output = run_node(node_env(support_data.index_path.parent, 1, EMBEDDER_MODEL=str(narrow)))
    assert code == 2, output[-3000:]
    line = next(line for line in output.splitlines() if "was built by the embedder" in line)
    assert f"this worker's embedder is {narrow}@" in line and f"(folder, float32, {hidden}-d)" in line
    assert f"dimension 768 vs {hidden}" in line and "set EMBEDDER_MODEL" in line
    assert "loaded and warmed" not in output  # refused before the models load
