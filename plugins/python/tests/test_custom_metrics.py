"""pb_utils.MetricFamily / Metric: what model.py files create and update shows up on /metrics, as in Triton."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

# Counts its instances (in initialize) and its requests, keeps the last X in a gauge and every X in a
# histogram; the request parameter "action" makes execute misuse the API instead.
METERED = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            labels = {"model": args["model_name"]}
            self.families = [
                pb_utils.MetricFamily("tsp_instances", "Instances initialized", pb_utils.MetricFamily.COUNTER),
                pb_utils.MetricFamily(name="tsp_requests", description="Requests executed",
                                      kind=pb_utils.MetricFamily.COUNTER),
                pb_utils.MetricFamily("tsp_last_x", "The last X", pb_utils.MetricFamily.GAUGE),
                pb_utils.MetricFamily("tsp_x", "Every X", pb_utils.MetricFamily.HISTOGRAM)]
            instances, requests, last_x, xs = self.families
            self.instances = instances.Metric(labels=labels)
            self.instances.increment(1)
            self.requests = requests.Metric(labels=labels)
            self.last_x = last_x.Metric(labels=labels)
            self.last_x.set(-1)
            self.xs = xs.Metric(labels=labels, buckets=[0.5, 1.0, 10.0])

        def execute(self, requests):
            responses = []
            for request in requests:
                action = json.loads(request.parameters()).get("action", "record")
                x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
                if action == "record":
                    self.requests.increment(1)
                    self.last_x.set(x)
                    self.xs.observe(x)
                elif action == "negative increment":
                    self.requests.increment(-1)
                elif action == "set counter":
                    self.requests.set(3)
                elif action == "histogram value":
                    self.xs.value()
                elif action == "redefine":
                    pb_utils.MetricFamily("tsp_requests", "Requests executed", pb_utils.MetricFamily.GAUGE)
                counts = np.array([self.requests.value(), self.instances.value()])
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("COUNTS", counts)]))
            return responses
"""
METERED_CONFIG = """
    input [ { name: "X", data_type: TYPE_FP64, dims: [ 1 ] } ]
    output [ { name: "COUNTS", data_type: TYPE_FP64, dims: [ 2 ] } ]
"""
# Runs the API's corner cases once and answers what each gave (a value, or "error: <message>").
PROBE = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    COUNTER, GAUGE, HISTOGRAM = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE, \\
        pb_utils.MetricFamily.HISTOGRAM

    def attempt(action):
        try:
            return action()
        except pb_utils.TritonModelException as error:
            return "error: " + str(error)

    class TritonPythonModel:
        def execute(self, requests):
            found = {}
            gauge = pb_utils.MetricFamily("tsp_probe_gauge", "first description", GAUGE)
            pb_utils.MetricFamily("tsp_probe_gauge", "second description", GAUGE)
            one, two = gauge.Metric(labels={"k": "v"}), gauge.Metric(labels={"k": "v"})
            one.increment(2023)
            one.increment(-23.5)
            found["shared value"] = two.value()
            two.set(999.9)
            found["after set"] = one.value()
            found["gauge observe"] = attempt(lambda: one.observe(1))
            histogram = pb_utils.MetricFamily("tsp_probe_histogram", "h", HISTOGRAM)
            found["no buckets"] = attempt(lambda: histogram.Metric(labels={}))
            found["unsorted buckets"] = attempt(lambda: histogram.Metric(buckets=[2.5, 0.1]))
            found["repeated buckets"] = attempt(lambda: histogram.Metric(buckets=[1, 1, 2]))
            unbounded = histogram.Metric(labels={"empty": "yes"}, buckets=[])
            unbounded.observe(4)
            found["histogram increment"] = attempt(lambda: unbounded.increment(1))
            counter = pb_utils.MetricFamily("tsp_probe_counter", "c", COUNTER)
            found["counter buckets"] = attempt(lambda: counter.Metric(buckets=[1.0]))
            found["labels not a dict"] = attempt(lambda: counter.Metric(labels=[("a", "b")]))
            found["bad label name"] = attempt(lambda: counter.Metric(labels={"1a": "b"}))
            found["bad family name"] = attempt(lambda: pb_utils.MetricFamily("tsp-probe", "x", COUNTER))
            orphan = counter.Metric(labels={"orphan": "yes"})
            del counter
            found["after family deleted"] = attempt(lambda: orphan.increment(1))
            self.kept = [gauge, histogram]
            return [pb_utils.InferenceResponse([pb_utils.Tensor("FOUND", np.array([json.dumps(found)], object))])
                    for _ in requests]
"""
PROBE_CONFIG = """
    input [ { name: "X", data_type: TYPE_FP64, dims: [ 1 ] } ]
    output [ { name: "FOUND", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, kit: Any) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("metrics_repo")
    kit.write_model(repo, "metered", METERED, METERED_CONFIG)
    kit.write_model(repo, "metered_pair", METERED, METERED_CONFIG + 'instance_group [ { count: 2, kind: KIND_CPU } ]')
    kit.write_model(repo, "probe", PROBE, PROBE_CONFIG)
    kit.write_model(repo, "passing", METERED, METERED_CONFIG)
    running = kit.start_server(repo, f"tsp_metrics_{repo.name}_", model_control_mode="explicit",
                               load_models=["metered", "metered_pair", "probe"])
    yield running
    running.stop()


def scrape(server: RunningServer) -> str:
    response = httpx.get(server.metrics_url, timeout=30)
    assert response.status_code == 200
    return response.text


def family(text: str, name: str) -> list[str]:
    """The HELP, TYPE and sample lines of family ``name``."""
    return [line for line in text.splitlines()
            if line.split(" ")[0].split("{")[0] in (name, f"{name}_count", f"{name}_sum", f"{name}_bucket")
            or line.startswith((f"# HELP {name} ", f"# TYPE {name} "))]


def x_input(x: float) -> http.InferInput:
    tensor = http.InferInput("X", [1], "FP64")
    tensor.set_data_from_numpy(np.array([x], np.float64))
    return tensor


def infer(client: http.InferenceServerClient, model: str, x: float = 0.0, action: str = "record") -> list[float]:
    return client.infer(model, [x_input(x)], parameters={"action": action}).as_numpy("COUNTS").tolist()


def test_metrics_from_initialize_and_execute_are_exported(server: RunningServer, client: http.InferenceServerClient) \
        -> None:
    assert infer(client, "metered", 0.25) == [1, 1]  # value() reads back what the server holds
    assert infer(client, "metered", 1.0) == [2, 1]
    assert infer(client, "metered", 20) == [3, 1]
    text = scrape(server)
    assert family(text, "tsp_requests")[:2] == ["# HELP tsp_requests Requests executed", "# TYPE tsp_requests counter"]
    assert 'tsp_requests{model="metered"} 3' in text.splitlines()
    assert family(text, "tsp_last_x")[:2] == ["# HELP tsp_last_x The last X", "# TYPE tsp_last_x gauge"]
    assert 'tsp_last_x{model="metered"} 20' in text.splitlines()
    assert 'tsp_last_x{model="metered_pair"} -1' in text.splitlines()  # set in initialize, no request since
    histogram = [line for line in family(text, "tsp_x") if "metered_pair" not in line]
    assert histogram == [
        "# HELP tsp_x Every X", "# TYPE tsp_x histogram",
        'tsp_x_count{model="metered"} 3', 'tsp_x_sum{model="metered"} 21.25',
        'tsp_x_bucket{model="metered",le="0.5"} 1', 'tsp_x_bucket{model="metered",le="1"} 2',
        'tsp_x_bucket{model="metered",le="10"} 2', 'tsp_x_bucket{model="metered",le="+Inf"} 3']
    # Triton's own families come first and keep their labels; custom ones get no model/version labels added.
    assert text.index("nv_inference_count") < text.index("tsp_requests")


def test_instances_of_a_model_update_one_metric(server: RunningServer) -> None:
    client = http.InferenceServerClient(server.http_url, concurrency=4)
    try:
        pending = [client.async_infer("metered_pair", [x_input(2.0)]) for _ in range(6)]
        results = [request.get_result().as_numpy("COUNTS") for request in pending]
    finally:
        client.close()
    assert {counts[1] for counts in results} == {2.0}  # each instance's initialize added 1 to the same metric
    lines = scrape(server).splitlines()
    assert 'tsp_instances{model="metered_pair"} 2' in lines
    assert 'tsp_requests{model="metered_pair"} 6' in lines
    assert 'tsp_x_bucket{model="metered_pair",le="10"} 6' in lines


@pytest.mark.parametrize("action, message", [
    ("negative increment", "Failed to increment metric value: Failed to process the request for model "
                           "'metered_0_0', message: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                           "monotonically by non-negative values."),
    ("set counter", "Failed to set metric value: Failed to process the request for model 'metered_0_0', "
                    "message: TRITONSERVER_METRIC_KIND_COUNTER does not support Set"),
    ("histogram value", "Failed to get metric value: Failed to process the request for model 'metered_0_0', "
                        "message: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"),
    ("redefine", "Error when creating MetricFamily: Failed to process the request for model 'metered_0_0', "
                 "message: Family name already exists with different type"),
])
def test_misuse_raises_in_the_model_and_fails_the_request(server: RunningServer, client: http.InferenceServerClient,
                                                          action: str, message: str) -> None:
    before = [line for line in scrape(server).splitlines() if line.startswith("tsp_requests{")]
    with pytest.raises(InferenceServerException) as raised:
        infer(client, "metered", action=action)
    assert message in str(raised.value.message())
    assert [line for line in scrape(server).splitlines() if line.startswith("tsp_requests{")] == before


def test_api_corner_cases_behave_as_in_triton(server: RunningServer, client: http.InferenceServerClient) -> None:
    found = json.loads(client.infer("probe", [x_input(0)]).as_numpy("FOUND")[0])
    server_said = "Failed to process the request for model 'probe_0_0', message: "
    assert found == {
        "shared value": 1999.5,  # two Metric objects with the same labels are one metric
        "after set": 999.9,
        "gauge observe": "error: Failed to observe metric value: " + server_said
                         + "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe",
        "no buckets": "error: Failed to create metric. Missing required buckets.",
        "unsorted buckets": "error: Error when creating Metric: " + server_said
                            + "Bucket Boundaries must be strictly sorted",
        "repeated buckets": "error: Error when creating Metric: " + server_said
                            + "Bucket Boundaries must be strictly sorted",
        "histogram increment": "error: Failed to increment metric value: " + server_said
                               + "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment",
        "counter buckets": "error: Failed to create metric. Unexpected buckets found.",
        "labels not a dict": "error: Failed to create metric. Labels must be a dictionary.",
        "bad label name": "error: Error when creating Metric: " + server_said + "Invalid label name",
        "bad family name": "error: Error when creating MetricFamily: " + server_said + "Invalid metric name",
        "after family deleted": "error: Failed to increment metric value: Invalid metric operation as the "
                                "corresponding 'MetricFamily' has been deleted. The 'MetricFamily' object should "
                                "be deleted AFTER its corresponding 'Metric' objects have been deleted.",
    }
    text = scrape(server)
    assert family(text, "tsp_probe_gauge") == ["# HELP tsp_probe_gauge first description",
                                               "# TYPE tsp_probe_gauge gauge", 'tsp_probe_gauge{k="v"} 999.9']
    assert family(text, "tsp_probe_histogram")[2:] == [
        'tsp_probe_histogram_count{empty="yes"} 1', 'tsp_probe_histogram_sum{empty="yes"} 4',
        'tsp_probe_histogram_bucket{empty="yes",le="+Inf"} 1']
    assert family(text, "tsp_probe_counter") == []  # its only metric went with the deleted family


def test_unloading_a_model_removes_its_metrics(server: RunningServer, client: http.InferenceServerClient) -> None:
    client.load_model("passing")
    infer(client, "passing", 5.0)
    text = scrape(server)
    assert 'tsp_requests{model="passing"} 1' in text.splitlines()
    client.unload_model("passing")
    text = scrape(server)
    assert 'model="passing"' not in text
    assert 'tsp_instances{model="metered"} 1' in text.splitlines()  # other models' metrics of the family stay
    client.load_model("passing")  # a fresh start: its metrics begin at 0 again
    assert infer(client, "passing", 5.0) == [1, 1]
    client.unload_model("passing")



def test_requests_through_front_end_processes_update_the_owners_metrics(tmp_path: Path, kit: Any,
                                                                         shm_prefix: str) -> None:
    kit.write_model(tmp_path, "forwarded", METERED, METERED_CONFIG)
    server = kit.start_server(tmp_path, shm_prefix, frontend_processes=2)
    client = http.InferenceServerClient(server.http_url)
    try:
        assert [infer(client, "forwarded", 7.0) for _ in range(3)] == [[1, 1], [2, 1], [3, 1]]
        lines = scrape(server).splitlines()
        assert 'tsp_requests{model="forwarded"} 3' in lines
        assert 'tsp_last_x{model="forwarded"} 7' in lines
    finally:
        client.close()
        server.stop()
