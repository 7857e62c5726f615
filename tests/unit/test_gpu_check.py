"""profiling.gpu_check: the table it prints, and a spent budget skipping what is left."""
import argparse

import pytest

from profiling.gpu_check import Check, OverBudget, table


def test_the_table_has_the_issues_columns_and_a_dash_for_what_was_not_measured():
    rows = {"auto": {"idle": 1.234, "idle_warm": 0.5, "c8": 43.61, "c32": 97.5, "steps": [51.0, 220.04, 220.0],
                     "graphs": [1, 2, 3]},
            "int8-dynamic": {"idle": 5.6, "steps": [39.0, 80.0, 174.0], "graphs": [None, None, None]}}
    assert table(rows).splitlines() == [
        "| | idle request | idle after the loads | concurrency 8 | concurrency 32 | decode step, 1 / 8 / 32 sequences "
        "| CUDA graphs |",
        "|---|---|---|---|---|---|---|",
        "| auto | 1.23 s | 0.50 s | 43.6 req/min | 97.5 req/min | 51.0 / 220.0 / 220.0 ms | 1 / 2 / 3 |",
        "| int8-dynamic | 5.60 s | - s | - req/min | - req/min | 39.0 / 80.0 / 174.0 ms | - / - / - |"]
    assert table({"auto": {}}).splitlines()[-1] == ("| auto | - s | - s | - req/min | - req/min | - / - / - ms "
                                                    "| - / - / - |")


def test_a_phase_after_the_budget_is_spent_is_skipped(tmp_path):
    check = Check(argparse.Namespace(budget_s=0.0, out=str(tmp_path), tiny=True))
    with pytest.raises(OverBudget):
        check.run("standins", ["builders.standins", "--profile", "tiny"])
    assert not (tmp_path / "standins.log").exists()


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.unit.test_precision" name="test_a[cuda-dtype0]" time="0.1" />
<testcase classname="tests.unit.test_precision" name="test_b[cuda]" time="0.1"><failure message="boom">x</failure></testcase>
<testcase classname="tests.unit.test_chunked_attention" name="test_c[matmul-cuda-bfloat16]" time="0.0">
<skipped type="pytest.skip" message="no CUDA device here">why</skipped></testcase>
<testcase classname="tests.unit.test_batch_invariance" name="test_d[cuda]" time="0.0"><error message="e">y</error></testcase>
</testsuite></testsuites>"""


def test_the_cuda_tests_outcomes_are_read_by_test_id_and_the_failures_listed():
    from profiling.gpu_check import junit_outcomes, results
    tests = junit_outcomes(JUNIT)
    assert tests == {"tests/unit/test_precision.py::test_a[cuda-dtype0]": "passed",
                     "tests/unit/test_precision.py::test_b[cuda]": "failed",
                     "tests/unit/test_chunked_attention.py::test_c[matmul-cuda-bfloat16]": "skipped: no CUDA device here",
                     "tests/unit/test_batch_invariance.py::test_d[cuda]": "error"}
    found = results({"auto": {"idle": 1.5}}, tests, device="torch 2.11.0 | NVIDIA H200", commit="abc", profile="faithful",
                    failed=True)
    assert found["cuda_tests_passed"] == 1
    assert found["cuda_tests_failed"] == ["tests/unit/test_batch_invariance.py::test_d[cuda]",
                                          "tests/unit/test_precision.py::test_b[cuda]"]
    assert (found["device"], found["commit"], found["precisions"]) == ("torch 2.11.0 | NVIDIA H200", "abc",
                                                                      {"auto": {"idle": 1.5}})
    assert results({}, None, device="d", commit="c", profile="tiny", failed=True)["cuda_tests_failed"] is None


SUMMARY = {"nodes": [
    {"url": "http://127.0.0.1:8000/metrics", "error": "", "stages": [
        {"stage": "embed", "batches": 10.0, "items": 40.0, "mean_batch_size": 4.0, "mean_batch_run_s": 0.02,
         "mean_item_wait_s": 0.0153, "queue_depth_after": 0.0},
        {"stage": "rerank", "batches": 0.0, "items": 0.0, "mean_batch_size": None, "mean_batch_run_s": None,
         "mean_item_wait_s": None, "queue_depth_after": 0.0}]},
    {"url": "http://127.0.0.1:8002/metrics", "error": "", "stages": [
        {"stage": "search", "batches": 8.0, "items": 32.0, "mean_batch_size": 4.0, "mean_batch_run_s": 0.004,
         "mean_item_wait_s": float("nan"), "queue_depth_after": 0.0}]},
    {"url": "http://127.0.0.1:8001/metrics", "error": "connection refused", "stages": []}]}


def test_the_breakdown_under_load_is_each_nodes_active_stages_in_ms():
    from profiling.gpu_check import breakdown_table, stage_breakdown
    rows = stage_breakdown(SUMMARY)
    assert rows == [
        {"node": "http://127.0.0.1:8000/metrics", "stage": "embed", "items": 40.0, "mean_batch": 4.0,
         "run_ms_per_batch": 20.0, "run_ms_per_item": 5.0, "wait_ms_per_item": 15.3},
        {"node": "http://127.0.0.1:8002/metrics", "stage": "search", "items": 32.0, "mean_batch": 4.0,
         "run_ms_per_batch": 4.0, "run_ms_per_item": 1.0, "wait_ms_per_item": None}]  # NaN: none to say
    assert stage_breakdown({}) == []
    lines = breakdown_table({"auto": {"c32_stages": rows}, "float16": {}}).splitlines()
    assert lines[2] == "| auto | http://127.0.0.1:8000/metrics | embed | 40 | 4.00 | 20.0 | 5.0 | 15.3 |"
    assert lines[3].endswith("| search | 32 | 4.00 | 4.0 | 1.0 | - |") and len(lines) == 4


def test_each_engine_trace_is_gzipped_beside_the_results_and_named_in_its_row(tmp_path):
    from profiling.gpu_check import save_traces
    run = tmp_path / "run"
    run.mkdir()
    (run / "trace_bfloat16_current_32.json").write_text('{"traceEvents": []}')
    rows = {"auto": {"engine_profile": {"top_ops": []}, "trace_file": str(run / "trace_bfloat16_current_32.json")},
            "float16": {"engine_profile": {"top_ops": []}, "trace_file": str(run / "absent.json")},
            "int8": {}}
    save_traces(rows, tmp_path / "gpu-check.json")
    import gzip
    assert gzip.decompress((tmp_path / "gpu-check-trace-auto.json.gz").read_bytes()) == b'{"traceEvents": []}'
    assert rows["auto"] == {"engine_profile": {"top_ops": [], "trace": "gpu-check-trace-auto.json.gz"}}
    assert rows["float16"] == {"engine_profile": {"top_ops": []}} and rows["int8"] == {}  # no file: nothing named
    assert not list(tmp_path.glob("gpu-check-trace-float16*"))


def test_the_decode_report_is_the_precisions_and_not_the_floor_table_beside_it(tmp_path):
    import json

    from profiling.gpu_check import decode_report
    (tmp_path / "bench_decode_floor.json").write_text(json.dumps({"rows": [{"sequences": 1, "step_ms": 2.0}]}))
    (tmp_path / "bench_decode_bfloat16.json").write_text(json.dumps({"rows": [{"sequences": 1, "cuda_graphs": 3}],
                                                                     "profiles": {}}))
    (tmp_path / "trace_bfloat16_current_1.json").write_text("{}")
    assert decode_report(tmp_path) == {"rows": [{"sequences": 1, "cuda_graphs": 3}], "profiles": {}}


def test_the_idle_breakdown_shows_each_stage_beside_its_batch_of_one_in_process(tmp_path):
    from profiling.gpu_check import breakdown_table, microbench_ms, stage_breakdown
    from profiling.lib.report import write_csv
    from profiling.microbench import BenchRow

    def row(stage: str, batch: int, median_s: float, kernels: str = "current") -> BenchRow:
        return BenchRow(stage, batch, 5, 2, median_s, median_s, median_s, median_s / batch, median_s / batch,
                        median_s / batch, batch / median_s, 10.0, 10.0, "bfloat16", "cuda", 1, "standin:faithful",
                        "", kernels)
    # what microbench writes: a CSV a stage, every batch size and kernel timed
    write_csv(tmp_path / "microbench_rerank.csv", [row("rerank", 1, 0.0466), row("rerank", 1, 0.05, "chunked"),
                                                   row("rerank", 2, 0.08)], BenchRow.columns())
    write_csv(tmp_path / "microbench_embed.csv", [row("embed", 1, 0.004)], BenchRow.columns())
    (tmp_path / "microbench_settings.json").write_text("{}")
    in_process = microbench_ms(tmp_path)
    assert in_process == {"embed": 4.0, "rerank": 46.6}
    idle = stage_breakdown(SUMMARY)
    lines = breakdown_table({"auto": {"idle_stages": idle, "in_process_ms": {"embed": 4.0}}}, "idle").splitlines()
    assert lines[0].endswith("| wait ms an item | in-process ms a batch of one |")
    assert lines[2] == "| auto | http://127.0.0.1:8000/metrics | embed | 40 | 4.00 | 20.0 | 5.0 | 15.3 | 4.0 |"
    assert lines[3].endswith("| search | 32 | 4.00 | 4.0 | 1.0 | - | - |")  # not timed in-process: a dash
    assert breakdown_table({"auto": {"idle_stages": idle}}, "idle").splitlines()[2].endswith("| 15.3 | - |")
    assert "in-process" not in breakdown_table({"auto": {"c32_stages": idle}})
    assert breakdown_table({"auto": {"idle_warm_stages": idle}}, "idle_warm").splitlines()[2].endswith("| 15.3 | - |")


def test_a_budget_spent_midway_through_the_cluster_keeps_its_finished_load_phases(tmp_path, monkeypatch):
    import json

    from profiling import gpu_check
    monkeypatch.setattr(gpu_check.local_cluster, "start", lambda env, folder, log: ([], [8000]))
    monkeypatch.setattr(gpu_check.local_cluster, "stop", lambda nodes: None)
    check = Check(argparse.Namespace(budget_s=600.0, out=str(tmp_path), tiny=True, spy=False))
    ran = []

    def run(name, argv, env=None):  # each loadgen phase writes its summary; the third finds the budget spent
        ran.append(name)
        if len(ran) == 3:
            raise OverBudget()
        phase = name.rsplit("-", 1)[1]
        (tmp_path / "loadgen-auto").mkdir(exist_ok=True)
        summary = {"overall": {"latency": {"p50_s": 1.5}, "throughput_rpm": 170.0}, **SUMMARY}
        (tmp_path / "loadgen-auto" / f"loadgen_{phase}.json").write_text(json.dumps(summary))
    monkeypatch.setattr(check, "run", run)
    found = {}
    with pytest.raises(OverBudget):
        check.cluster("auto", found)
    assert ran == ["loadgen-auto-idle", "loadgen-auto-c8", "loadgen-auto-c32"]
    assert (found["idle"], found["c8"]) == (1.5, 170.0) and "c32" not in found
    assert found["c8_stages"] == gpu_check.stage_breakdown(SUMMARY)


def test_phases_outside_the_list_are_refused_by_name(capsys):
    from profiling.gpu_check import main
    with pytest.raises(SystemExit) as exit_:
        main(["--phases", "cluster,warmup", "--tiny"])
    assert exit_.value.code == 2
    assert "--phases: unknown warmup; expected some of tests, steps, cluster, in_process, profile, floor" in capsys.readouterr().err


def test_the_floor_line_puts_the_null_model_overhead_against_each_precisions_request_at_32_clients():
    from profiling.gpu_check import floor_line
    floor = {"clients": 32, "requests_per_minute": 3100.0, "p50_ms": 286.0, "cpu_ms": 30.5, "ok": 160, "sent": 160}
    line = floor_line({"auto": {"c32_p50_s": 2.86}, "float16": {}}, floor)
    assert line == ("the floor at 32 clients (null models, this host): 286.0 ms p50, 30.5 ms of the nodes' CPU a request, "
                    "3100.0 req/min; auto: 10.0 % of its request's 2.86 s at 32 clients")
    assert floor_line({"auto": {"c32_p50_s": 2.86}}, None) == "the floor at 32 clients: not measured"


def test_the_floor_phase_reads_the_last_level_of_the_overhead_floors_results(tmp_path, monkeypatch):
    import json
    check = Check(argparse.Namespace(budget_s=600.0, out=str(tmp_path), tiny=False))
    ran = []

    def run(name, argv, env=None):  # what profiling.overhead_floor writes, for one level
        ran.append(argv)
        level = {"clients": 32, "sent": 160, "ok": 160, "requests_per_minute": 3000.0, "latency_ms": {"p50": 300.0},
                 "components_ms": {"nodes: CPU ms per request": 31.0}}
        folder = tmp_path / "overhead_floor"
        folder.mkdir()
        (folder / "overhead_floor.json").write_text(json.dumps({"results": {"here": {"levels": [level]}}}))
    monkeypatch.setattr(check, "run", run)
    assert check.overhead_floor() == {"clients": 32, "requests_per_minute": 3000.0, "p50_ms": 300.0, "ok": 160,
                                      "sent": 160, "cpu_ms": 31.0}
    assert ran[0][0] == "profiling.overhead_floor" and ran[0][ran[0].index("--clients") + 1] == "32"


def test_the_generate_stages_breakdown_has_the_engines_time_a_step_under_load():
    from profiling.gpu_check import engine_lines, stage_breakdown
    generate = {"stage": "generate", "batches": 46.0, "items": 80.0, "mean_batch_size": 1.74, "mean_batch_run_s": 0.324,
                "mean_item_wait_s": 0.047, "queue_depth_after": 0.0, "decode_steps": 1000.0, "step_sequences": 12000.0}
    (row,) = stage_breakdown({"nodes": [{"url": "n0", "stages": [generate]}]})
    assert (row["decode_steps"], row["engine_ms_per_step"], row["sequences_per_step"]) == (1000.0, 14.9, 12.0)
    assert engine_lines({"auto": {"c32_stages": [row]}}) == ("auto n0: 1000 decode steps, 14.90 ms of the engine a "
                                                             "step, 12.00 sequences a step")
    (other,) = stage_breakdown({"nodes": [{"url": "n0", "stages": [{**generate, "stage": "rerank", "decode_steps": None}]}]})
    assert "decode_steps" not in other


def test_the_gil_lines_name_node_1s_threads_by_their_samples():
    from profiling.gpu_check import gil_lines
    gil = {"continuous-generate": {"samples": 332, "top": {"a;b;decode": 62, "a;b;choose": 43}},
           "waitress": {"samples": 152, "top": {"x;y;submit": 20}}}
    assert gil_lines({"auto": {"c32_gil": gil}, "float16": {}}).splitlines()[1:] == [
        "auto node 1 GIL: continuous-generate 332 samples; a;b;decode 62; a;b;choose 43",
        "auto node 1 GIL: waitress 152 samples; x;y;submit 20"]
    assert gil_lines({"auto": {}}) == ""
