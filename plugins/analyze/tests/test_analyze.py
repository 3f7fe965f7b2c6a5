"""``triton-serve analyze`` end to end: real perf_analyzer runs on add_sub and an ONNX model (short budgets),
and the bad-input paths with a fake perf_analyzer (unmet constraints, failed loads, a server that dies
mid-sweep and the resume after it, unknown models, a zero budget)."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from triton_serve.testing import EXAMPLE_REPOSITORY, ToyBackendsPlugin
from triton_serve_analyze.cli import main
from triton_serve_analyze.measure import MeasureFailed, PerfAnalyzer
from triton_serve_analyze.search import MEASURED
from triton_serve_analyze.server import LocalServer, ServerClient

MODEL_ANALYZER = Path(__file__).resolve().parents[3] / "ma-venv" / "bin" / "model-analyzer"

FAST = ["--measurement-interval-ms", "200", "--max-trials", "3", "--max-concurrency", "2"]

TOY_ADD_SUB = """
backend: "toy_add_sub"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""

# A Python model that refuses to load with a max_batch_size above 4.
PICKY_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        if json.loads(args["model_config"])["max_batch_size"] > 4:
            raise pb_utils.TritonModelException("picky: max_batch_size above 4")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
'''
PICKY_CONFIG = """
backend: "python"
max_batch_size: 2
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ONNX_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _rows(output: Path) -> list[dict[str, str]]:
    with (output / "measurements.csv").open() as handle:
        return list(csv.DictReader(handle))


def _chosen(output: Path) -> dict[str, str]:
    chosen = [row for row in _rows(output) if row["chosen"] == "True"]
    assert len(chosen) == 1
    return chosen[0]


def _check_report(output: Path, model: str) -> str:
    html = (output / "report.html").read_text()
    assert f"<h2>{model}</h2>" in html
    assert len(re.findall(r"src='data:image/png;base64,[A-Za-z0-9+/=]{1000,}'", html)) == 2  # plots, embedded
    assert "<script" not in html and "http" not in html.split("<body>")[1].split("<code>")[0]
    return html


# ---- real perf_analyzer ------------------------------------------------------------------------

def test_add_sub_quick_search_writes_a_config_that_serves(
        add_sub_repo: Path, perf_analyzer: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out"
    status = main(["--model-repository", str(add_sub_repo), "--model", "add_sub", "--perf-analyzer", perf_analyzer,
                   "--max-batch-sizes", "1,4", "--instance-counts", "1", "--max-queue-delays-us", "0",
                   "--time-budget", "120", "--output-dir", str(output), *FAST])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "best: mbs=" in out and "config written to" in out
    chosen = _chosen(output)
    assert {row["candidate"] for row in _rows(output)} >= {chosen["candidate"]}
    assert chosen["status"] == MEASURED
    for row in _rows(output):  # a candidate perf_analyzer could not measure (a busy machine) says why
        assert float(row["throughput_infer_per_s"]) > 0 if row["status"] == MEASURED else row["error"], row
    _check_report(output, "add_sub")
    written = add_sub_repo / "add_sub" / "configs" / "analyzed.pbtxt"
    text = written.read_text()
    assert text.startswith("# Chosen by `triton-serve analyze`")
    assert f"max_batch_size: {chosen['max_batch_size']}\n" in text
    assert ("dynamic_batching" in text) == (chosen["dynamic_batching"] == "True")
    original = (EXAMPLE_REPOSITORY / "add_sub" / "config.pbtxt").read_text()
    assert (add_sub_repo / "add_sub" / "config.pbtxt").read_text() == original  # left as it was
    # Served with --model-config-name, the written config is the one in use, and perf_analyzer measures it.
    server = LocalServer(str(add_sub_repo), tmp_path / "verify.log", ["--model-config-name", "analyzed"])
    try:
        server.client.load("add_sub")
        served = server.client.config("add_sub")
        assert served["max_batch_size"] == int(chosen["max_batch_size"])
        assert served["instance_group"][0]["count"] == int(chosen["instance_count"])
        perf = PerfAnalyzer(perf_analyzer, server.client.host_port, measurement_interval_ms=500, max_trials=3)
        again = perf.run("add_sub", int(chosen["concurrency"]), 1)
    finally:
        server.stop()
    assert again.throughput > 0 and again.p50_us > 0


def _double_onnx() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "X"], ["Y"])], "double",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_onnx_exhaustive_search_writes_an_output_repository(
        perf_analyzer: str, tmp_path: Path, tserve: Callable[..., Any], capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("triton_serve_onnx", reason="needs the ONNX Runtime backend plugin")
    repo = tmp_path / "models"
    (repo / "double" / "1").mkdir(parents=True)
    (repo / "double" / "1" / "model.onnx").write_bytes(_double_onnx())
    (repo / "double" / "config.pbtxt").write_text(ONNX_CONFIG)
    output, written = tmp_path / "out", tmp_path / "tuned"
    status = main(["--model-repository", str(repo), "--model", "double", "--perf-analyzer", perf_analyzer,
                   "--search", "exhaustive", "--no-early-stop", "--max-batch-sizes", "2,8", "--instance-counts", "1,2",
                   "--dynamic-batching", "on", "--max-queue-delays-us", "0", "--time-budget", "120",
                   "--output-dir", str(output), "--output-model-repository", str(written), *FAST])
    assert status == 0, capsys.readouterr()
    assert {row["candidate"] for row in _rows(output)} == {
        "mbs=2 count=1 dyn=0us", "mbs=8 count=1 dyn=0us", "mbs=2 count=2 dyn=0us", "mbs=8 count=2 dyn=0us"}
    _check_report(output, "double")
    assert not (repo / "double" / "configs").exists()
    assert (written / "double" / "1" / "model.onnx").read_bytes() == (repo / "double" / "1" / "model.onnx").read_bytes()
    assert f"max_batch_size: {_chosen(output)['max_batch_size']}\n" in (written / "double" / "config.pbtxt").read_text()
    server = tserve(written)
    x = httpclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    result = httpclient.InferenceServerClient(server.http_url).infer("double", [x])
    assert result.as_numpy("Y").tolist() == [[0.0, 2.0, 4.0, 6.0]]


# ---- fake perf_analyzer: the bad-input paths -----------------------------------------------------

@pytest.fixture
def toy_server(tmp_path: Path, tserve: Callable[..., Any]) -> Any:
    repo = tmp_path / "models"
    (repo / "add_sub" / "1").mkdir(parents=True)
    (repo / "add_sub" / "config.pbtxt").write_text(TOY_ADD_SUB)
    server = tserve(repo, model_control_mode="explicit", load_models=["add_sub"],
                    extra_plugins=[("toy", ToyBackendsPlugin())])
    server.repo = repo
    return server


def test_constraints_no_configuration_meets(toy_server: Any, fake_perf_analyzer: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAKE_PA_P99_US", "5000")
    output = tmp_path / "out"
    status = main(["--url", toy_server.http_url, "--model-repository", str(toy_server.repo), "--model", "add_sub",
                   "--perf-analyzer", fake_perf_analyzer, "--max-latency-p99-ms", "1", "--max-batch-sizes", "2,4",
                   "--instance-counts", "1", "--max-queue-delays-us", "0", "--output-dir", str(output), *FAST])
    captured = capsys.readouterr()
    assert status == 3
    assert "no configuration meets maximum throughput with p99 <= 1 ms; closest: mbs=" in captured.out
    assert "p99 5.00 ms" in captured.out
    assert not (toy_server.repo / "add_sub" / "configs").exists()
    assert "no configuration meets" in (output / "report.html").read_text()
    assert all(row["meets_constraints"] == "False" for row in _rows(output))
    assert "add_sub 1/" in captured.err  # the progress lines
    # A server analyze did not start is left as it was found: the model served from its own config.
    client = httpclient.InferenceServerClient(toy_server.http_url)
    assert client.is_model_ready("add_sub")
    assert client.get_model_config("add_sub")["max_batch_size"] == 8


def test_a_candidate_that_fails_to_load_is_recorded_and_the_sweep_goes_on(
        tmp_path: Path, tserve: Callable[..., Any], fake_perf_analyzer: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("triton_serve_python", reason="the picky model is a Python-backend model")
    repo = tmp_path / "models"
    (repo / "picky" / "1").mkdir(parents=True)
    (repo / "picky" / "1" / "model.py").write_text(PICKY_MODEL)
    (repo / "picky" / "config.pbtxt").write_text(PICKY_CONFIG)
    server = tserve(repo, model_control_mode="explicit")
    output = tmp_path / "out"
    status = main(["--url", server.http_url, "--model-repository", str(repo), "--model", "picky", "--perf-analyzer",
                   fake_perf_analyzer, "--search", "exhaustive", "--no-early-stop", "--max-batch-sizes", "8,2",
                   "--instance-counts", "1", "--dynamic-batching", "on", "--max-queue-delays-us", "0",
                   "--output-dir", str(output), *FAST])
    assert status == 0, capsys.readouterr()
    rows = {row["candidate"]: row for row in _rows(output)}
    assert rows["mbs=8 count=1 dyn=0us"]["status"] == "load failed"
    assert "picky: max_batch_size above 4" in rows["mbs=8 count=1 dyn=0us"]["error"]
    assert rows["mbs=2 count=1 dyn=0us"]["status"] == "measured"
    assert _chosen(output)["candidate"] == "mbs=2 count=1 dyn=0us"
    assert "max_batch_size: 2\n" in (repo / "picky" / "configs" / "analyzed.pbtxt").read_text()
    assert not httpclient.InferenceServerClient(server.http_url).is_model_ready("picky")  # not loaded before


def test_a_model_an_ensemble_calls_keeps_a_max_batch_size_the_ensemble_loads_with(
        tmp_path: Path, fake_perf_analyzer: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("triton_serve_python", reason="the example models are Python-backend models")
    pytest.importorskip("triton_serve_ensemble", reason="the example ensemble needs the ensemble plugin")
    repo = tmp_path / "models"
    for name in ("preprocess", "add_sub", "postprocess", "ensemble_add_sub"):  # ensemble_add_sub: max_batch_size 8
        shutil.copytree(EXAMPLE_REPOSITORY / name, repo / name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the default output folder
    status = main(["--model-repository", str(repo), "--model", "add_sub", "--perf-analyzer", fake_perf_analyzer,
                   "--search", "exhaustive", "--no-early-stop", "--max-batch-sizes", "1,2,16",
                   "--instance-counts", "1", "--dynamic-batching", "on", "--max-queue-delays-us", "0", *FAST])
    out = capsys.readouterr().out
    assert status == 0, out
    assert ("model 'add_sub' is called by ensemble 'ensemble_add_sub' (max_batch_size 8): max_batch_size "
            "candidates kept to 16 so that it keeps loading") in out
    output = tmp_path / "cache" / "triton-serve" / "analyze" / "add_sub"
    assert f"report: {output / 'report.html'}" in out
    assert {row["candidate"] for row in _rows(output)} == {"mbs=16 count=1 dyn=0us"}
    # Served as docs/analyze.md says, the tuned model and the ensemble that calls it both load and answer.
    server = LocalServer(str(repo), tmp_path / "verify.log", ["--model-config-name", "analyzed"])
    try:
        server.client.load("add_sub")
        server.client.load("preprocess")
        server.client.load("postprocess")
        server.client.load("ensemble_add_sub")
        raw = httpclient.InferInput("RAW", [1, 16], "FP32")
        raw.set_data_from_numpy(np.full((1, 16), 2.5, np.float32))
        result = httpclient.InferenceServerClient(server.client.host_port).infer("ensemble_add_sub", [raw])
        np.testing.assert_allclose(result.as_numpy("RAW_PLUS_ONE"), np.full((1, 16), 3.5), rtol=1e-3)
    finally:
        server.stop()


def test_a_server_that_dies_mid_sweep_keeps_the_checkpoint_and_a_rerun_resumes(
        add_sub_repo: Path, fake_perf_analyzer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out"
    first = LocalServer(str(add_sub_repo), tmp_path / "first.log", [])
    monkeypatch.setenv("FAKE_PA_KILL_PID", str(first.process.pid))
    monkeypatch.setenv("FAKE_PA_KILL_AT", "3")  # the first candidate takes runs 1 and 2 (concurrency 1, 2)
    args = ["--model-repository", str(add_sub_repo), "--model", "add_sub", "--perf-analyzer", fake_perf_analyzer,
            "--search", "exhaustive", "--no-early-stop", "--max-batch-sizes", "1,2", "--instance-counts", "1",
            "--dynamic-batching", "on", "--max-queue-delays-us", "0", "--output-dir", str(output), *FAST]
    try:
        status = main(["--url", first.client.url, *args])
    finally:
        first.stop()
    err = capsys.readouterr().err
    assert status == 1
    assert f"error: the server at {first.client.url} " in err
    assert "run the same command again to resume" in err
    kept = json.loads((output / "checkpoint.json").read_text())["results"]["add_sub"]
    assert list(kept) == ["mbs=1 count=1 dyn=0us"]
    monkeypatch.delenv("FAKE_PA_KILL_AT")
    second = LocalServer(str(add_sub_repo), tmp_path / "second.log", [])
    try:
        status = main(["--url", second.client.url, *args])
    finally:
        second.stop()
    captured = capsys.readouterr()
    assert status == 0, captured
    assert "resuming from" in captured.err and "1 candidates already measured" in captured.err
    assert "2 candidates (1 measured now)" in captured.out
    assert {row["candidate"] for row in _rows(output)} == {"mbs=1 count=1 dyn=0us", "mbs=2 count=1 dyn=0us"}


def test_unknown_model_and_bad_flags(toy_server: Any, fake_perf_analyzer: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--url", toy_server.http_url, "--model-repository", str(toy_server.repo),
              "--perf-analyzer", fake_perf_analyzer, "--output-dir", str(tmp_path / "out")]
    assert main([*common, "--model", "nope"]) == 2
    assert "error: model 'nope' is not in the server's model repository (models: add_sub)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--model", "add_sub", "--time-budget", "0"])
    assert exit_info.value.code == 2
    assert "--time-budget: expected a number above 0, got '0'" in capsys.readouterr().err
    assert main([*common, "--model", "add_sub", "--perf-analyzer", str(tmp_path / "missing")]) == 2
    assert "is not an executable file" in capsys.readouterr().err


@pytest.mark.parametrize(("variable", "message"), [
    ("FAKE_PA_MIN_INTERVAL_MS", "No valid requests recorded within time interval"),
    ("FAKE_PA_STABLE_FROM_MS", "Failed to obtain stable measurement"),
], ids=["no request finished", "never stable"])
def test_windows_too_short_for_the_machine_are_measured_again_in_longer_ones(
        fake_perf_analyzer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, message: str) -> None:
    perf = PerfAnalyzer(fake_perf_analyzer, "localhost:1", measurement_interval_ms=200)
    intervals = tmp_path / "fake_pa_intervals"
    monkeypatch.setenv(variable, "3000")
    assert perf.run("add_sub", 2, 1).throughput == 2000.0
    assert intervals.read_text().split() == ["200", "800", "3200"]
    intervals.unlink()
    monkeypatch.setenv(variable, "4000")
    with pytest.raises(MeasureFailed, match=f"^perf_analyzer: {message}, in windows of up to 3200 ms$"):
        perf.run("add_sub", 2, 1)
    assert intervals.read_text().split() == ["200", "800", "3200"]


def test_a_server_in_another_control_mode_is_refused(tmp_path: Path, tserve: Callable[..., Any],
                                                    fake_perf_analyzer: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "models"
    (repo / "add_sub" / "1").mkdir(parents=True)
    (repo / "add_sub" / "config.pbtxt").write_text(TOY_ADD_SUB)
    server = tserve(repo, extra_plugins=[("toy", ToyBackendsPlugin())])  # model control mode "none"
    status = main(["--url", server.http_url, "--model-repository", str(repo), "--model", "add_sub",
                   "--perf-analyzer", fake_perf_analyzer, "--output-dir", str(tmp_path / "out"), *FAST])
    assert status == 1
    assert "start it with --model-control-mode=explicit" in capsys.readouterr().err


def test_the_command_is_registered_through_the_hook() -> None:
    from triton_serve.testing import PluginHost

    commands = PluginHost().commands
    assert commands.owner("analyze") == "analyze"
    assert ServerClient("localhost:1").host_port == "localhost:1"
    assert os.access(Path(__file__).with_name("fake_perf_analyzer.py"), os.R_OK)


def test_candidates_change_only_their_fields() -> None:
    from triton_serve_analyze.space import Candidate, apply_to_json, apply_to_proto, parse_pbtxt, to_pbtxt

    served = {"max_batch_size": 8, "instance_group": [{"name": "m_0", "count": 1, "kind": "KIND_CPU"}],
              "dynamic_batching": {"max_queue_delay_microseconds": 5, "preserve_ordering": True}}
    on = Candidate(4, 3, True, 100, (4,))
    changed = apply_to_json(served, on)
    assert changed["max_batch_size"] == 4 and changed["instance_group"][0] == {"name": "m_0", "count": 3,
                                                                                 "kind": "KIND_CPU"}
    assert changed["dynamic_batching"] == {"max_queue_delay_microseconds": 100, "preserve_ordering": True,
                                           "preferred_batch_size": [4]}
    assert "dynamic_batching" not in apply_to_json(served, Candidate(4, 1, False))
    assert served["max_batch_size"] == 8  # the served config itself is not changed
    written = to_pbtxt(apply_to_proto(parse_pbtxt('name: "m"\nbackend: "python"\nmax_batch_size: 8\n'), on, served))
    assert written == ('name: "m"\nmax_batch_size: 4\ninstance_group {\n  count: 3\n  kind: KIND_CPU\n}\n'
                       'dynamic_batching {\n  preferred_batch_size: 4\n  max_queue_delay_microseconds: 100\n}\n'
                       'backend: "python"\n')


class _Landscape:
    """A server and perf_analyzer in one, with no server: the throughput is a function of the loaded
    configuration (``table[(mbs, count, dynamic batching)]``), so the search is tested by itself."""

    url = "synthetic"

    def __init__(self, table: dict[tuple[int, int, bool], float]) -> None:
        self.table, self.loaded, self.loads = table, (0, 0, False), 0

    def live(self) -> bool:
        return True

    def load(self, model: str, config: dict[str, Any] | None = None) -> None:
        assert config is not None
        self.loaded = (config["max_batch_size"], config["instance_group"][0]["count"],
                       "dynamic_batching" in config)
        self.loads += 1

    def unload(self, model: str) -> None:
        pass

    def run(self, model: str, concurrency: int, batch_size: int) -> Any:
        from triton_serve_analyze.measure import Measurement

        return Measurement(concurrency, batch_size, self.table[self.loaded], 900.0, 950.0, 980.0, 1000.0)


def test_quick_search_reaches_the_best_past_a_plateau(tmp_path: Path) -> None:
    """The landscape that made the plain hill climb stop one step short (the MLP run in docs/analyze.md):
    throughput dips at max_batch_size 4 (a plateau, or one noisy window) before its peak at 8. The climb
    from (1, 1 instance, dynamic batching) stopped at 2; the quick search looks two steps away, finds 8,
    measuring 11 of the 20 candidates."""
    from triton_serve_analyze.search import Budget, Checkpoint, Goal, ModelSearch, Sweep
    from triton_serve_analyze.space import Batching, SearchSpace

    by_size = {1: 100.0, 2: 200.0, 4: 190.0, 8: 400.0, 16: 300.0}
    table = {(mbs, count, dyn): value * (1.0 if count == 1 else 0.9) * (1.0 if dyn else 0.8)
             for mbs, value in by_size.items() for count in (1, 2) for dyn in (False, True)}
    space = SearchSpace([1, 2, 4, 8, 16], [1, 2], [Batching(False), Batching(True)])
    base = {"max_batch_size": 16, "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}

    def search(mode: str) -> tuple[Any, int]:
        landscape = _Landscape(table)
        model = ModelSearch("m", base, space, Goal(), Sweep(max_concurrency=1), landscape,  # type: ignore[arg-type]
                            landscape, Budget(60.0), Checkpoint(tmp_path / f"{mode}.json", {}))  # type: ignore[arg-type]
        model.run(mode, early_stop=False)
        best = model.best()
        assert best is not None and not model.stopped_by_budget
        return best[0].candidate, landscape.loads

    exhaustive, all_runs = search("exhaustive")
    quick, quick_runs = search("quick")
    assert (exhaustive.max_batch_size, exhaustive.instance_count, exhaustive.dynamic_batching) == (8, 1, True)
    assert quick == exhaustive
    assert all_runs == 20 and quick_runs <= 12, quick_runs


def test_triton_model_analyzer_in_remote_mode(add_sub_repo: Path, perf_analyzer: str, tmp_path: Path,
                                              tserve: Callable[..., Any]) -> None:
    """Triton's own Model Analyzer, remote launch mode, against triton-serve (docs/analyze.md): the one in
    the checkout's ma-venv (scripts/install.sh), or ``MODEL_ANALYZER=/path/to/model-analyzer``. About 40 s."""
    import subprocess

    analyzer = os.environ.get("MODEL_ANALYZER") or str(MODEL_ANALYZER)
    if not os.access(analyzer, os.X_OK):
        pytest.skip(f"Model Analyzer is not installed at {analyzer} (run scripts/install.sh, or set MODEL_ANALYZER)")
    server = tserve(add_sub_repo, model_control_mode="explicit")
    http_port, grpc_port = server.http_url.rsplit(":", 1)[1], server.grpc_url.rsplit(":", 1)[1]
    config = tmp_path / "ma.yml"
    config.write_text(f"""model_repository: {add_sub_repo}
triton_launch_mode: remote
triton_http_endpoint: 127.0.0.1:{http_port}
triton_grpc_endpoint: 127.0.0.1:{grpc_port}
triton_metrics_url: {server.metrics_url}
perf_analyzer_path: {perf_analyzer}
output_model_repository_path: {tmp_path / 'ma-out'}
override_output_model_repository: true
export_path: {tmp_path}
checkpoint_directory: {tmp_path / 'checkpoints'}
run_config_search_max_concurrency: 2
run_config_search_max_model_batch_size: 2
run_config_search_max_instance_count: 1
profile_models:
  add_sub:
    cpu_only: true
    perf_analyzer_flags:
      stability-percentage: 999  # as triton-serve analyze's default: the suite's other workers vary latency
""")
    done = subprocess.run([analyzer, "profile", "-f", str(config)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with (tmp_path / "results" / "metrics-model-inference.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {row["Model Config Path"] for row in rows} >= {"add_sub_config_default", "add_sub_config_0"}
    assert all(float(row["Throughput (infer/sec)"]) > 0 for row in rows)
