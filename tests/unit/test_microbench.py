"""profiling.microbench on tiny stand-ins and the small course data: files, columns, sane numbers."""
from __future__ import annotations

import csv
import math
import os

import pytest

from profiling import microbench
from profiling.lib import inputs
from tests.helpers import TEST_ENV, recording_tool_commit

STAGES = ("embed", "search", "fetch", "sentiment", "generate")
MODEL_STAGES = {"embed", "sentiment", "generate"}
BATCH_SIZES = [1, 2]
MAX_NEW_TOKENS = 4


@pytest.fixture(scope="module")
def bench_out(course_data, tmp_path_factory):
    """Runs the CLI once for every stage (a comma-separated list), in-process (a subprocess would pay torch's
    import)."""
    out = tmp_path_factory.mktemp("microbench")
    env = {**os.environ, **TEST_ENV}
    with recording_tool_commit():
        code = microbench.main(
            ["--stage", ",".join(STAGES), "--batch-sizes", ",".join(map(str, BATCH_SIZES)), "--repeat", "2",
             "--warmup", "1", "--max-new-tokens", str(MAX_NEW_TOKENS), "--index", str(course_data.index_path),
             "--documents", str(course_data.db_path.parent), "--out", str(out), "--no-progress"],
            env=env)
    return out, code


def read_rows(path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


@pytest.mark.parametrize("stage", STAGES)
def test_csv_has_one_sane_row_per_batch_size(bench_out, stage):
    out, code = bench_out
    assert code == 0
    columns, rows = read_rows(out / f"microbench_{stage}.csv")
    assert columns == microbench.BenchRow.columns()
    assert [int(r["batch_size"]) for r in rows] == BATCH_SIZES
    for r in rows:
        n = int(r["batch_size"])
        lo, med, hi = float(r["batch_s_min"]), float(r["batch_s_median"]), float(r["batch_s_max"])
        assert 0 < lo <= med <= hi
        assert math.isclose(float(r["item_s_median"]), med / n, rel_tol=1e-9)
        assert 0 < float(r["item_s_min"]) <= float(r["item_s_median"]) <= float(r["item_s_max"])
        # items/s and the per-item time describe the same median run.
        assert math.isclose(float(r["items_per_s"]) * float(r["item_s_median"]), 1.0, rel_tol=1e-6)
        assert float(r["peak_rss_mib"]) > 0 and float(r["rss_mib"]) > 0
        assert (r["stage"], r["repeat"], r["warmup"], r["device"]) == (stage, "2", "1", "cpu")
        assert int(r["threads"]) >= 1
        if stage in MODEL_STAGES:
            assert (r["dtype"], r["model_source"]) == ("float32", "standin:tiny")


@pytest.mark.parametrize("stage", STAGES)
def test_plot_written(bench_out, stage):
    png = bench_out[0] / f"microbench_{stage}.png"
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) < 200_000


def test_details_explain_the_inputs(bench_out):
    out, _ = bench_out
    search = read_rows(out / "microbench_search.csv")[1][0]["detail"]
    assert "k=10" in search and "nprobe=" in search and "ntotal=3000" in search
    generate = read_rows(out / "microbench_generate.csv")[1]
    # Full decoding is forced, so every run really generated --max-new-tokens tokens, by the engine that serves.
    assert all(f"out_tokens={float(MAX_NEW_TOKENS)}" in r["detail"] for r in generate)
    assert all("decoder=continuous engine" in r["detail"] for r in generate)


def test_realistic_inputs():
    from builders.corpus import support_documents
    pool = list(support_documents(40))
    texts = inputs.answer_texts(pool, 16)
    assert all(380 <= len(t) <= 512 and t.startswith("Answer: ") for t in texts)
    short = [d.__class__(d.doc_id, d.title, d.content[:90], d.category) for d in pool]
    assert all(380 <= len(t) <= 512 for t in inputs.answer_texts(short, 16))
    requests = inputs.rerank_inputs(pool, 3)
    assert [len(r.documents) for r in requests] == [10, 10, 10]
    assert inputs.spec_queries(10)[8] == inputs.spec_queries(1)[0]


def test_stages_are_all_or_a_list_of_known_ones_in_the_order_given():
    assert microbench.parse_stages("all") == list(microbench.STAGES)
    assert microbench.parse_stages("rerank,embed,rerank") == ["rerank", "embed"]
    with pytest.raises(SystemExit) as exc:
        microbench.main(["--stage", "embed,rank"])
    assert exc.value.code == 2


def test_bad_batch_sizes_are_refused():
    with pytest.raises(SystemExit) as exc:
        microbench.main(["--stage", "embed", "--batch-sizes", "0,2"])
    assert exc.value.code == 2


def test_a_baseline_is_timed_beside_the_current_kernels_on_the_same_batches(tmp_path, capsys):
    from pipeline.kernels.ordered_attention import EXTENSION
    built = EXTENSION.ops
    with recording_tool_commit():
        code = microbench.main(["--stage", "embed", "--batch-sizes", "1,2", "--repeat", "2", "--warmup", "1",
                                "--baseline", "chunked-attention", "--out", str(tmp_path), "--no-progress"],
                               env={**os.environ, **TEST_ENV})
    assert code == 0 and EXTENSION.ops == built  # the current kernels are back
    _, rows = read_rows(tmp_path / "microbench_embed.csv")
    assert [(r["kernels"], int(r["batch_size"])) for r in rows] == [
        ("current", 1), ("chunked-attention", 1), ("current", 2), ("chunked-attention", 2)]
    assert all(int(r["repeat"]) == 2 and float(r["batch_s_median"]) > 0 for r in rows)
    printed = capsys.readouterr().out
    assert "embed batch 1: chunked-attention / current = " in printed and "embed batch 2:" in printed


def test_an_unknown_baseline_is_refused():
    with pytest.raises(SystemExit) as exc:
        microbench.main(["--stage", "embed", "--baseline", "fast-attention"])
    assert exc.value.code == 2
