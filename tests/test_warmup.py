"""Model warmup (``model_warmup``): samples run on every instance before the model turns ready."""
from __future__ import annotations

import json
import struct
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

# Appends one JSON line per execute call to the file named by the LOG parameter: the instance,
# how many requests the batch had, and per request each input's shape, dtype and first value.
# An input X holding 7 fails the request; one holding 9 fails the whole execute call.
RECORDER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.log = config["parameters"]["LOG"]["string_value"]
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        seen, responses = [], []
        for request in requests:
            inputs = {}
            for name in ("X", "S"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is None:
                    continue
                array = tensor.as_numpy()
                first = array.flat[0]
                inputs[name] = [list(array.shape), str(array.dtype),
                                first.decode() if isinstance(first, bytes) else float(first)]
            seen.append(inputs)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x == 9).any():
                raise pb_utils.TritonModelException("X holds 9")
            if (x == 7).any():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("X holds 7")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.astype(np.float32))]))
        with open(self.log, "a") as log:
            log.write(json.dumps({"instance": self.instance, "requests": seen}) + "\\n")
        return responses
'''


def write_recorder(repo: Path, name: str, log: Path, warmup: str, *, max_batch_size: int = 8,
                   instances: int = 1, files: dict[str, bytes] | None = None) -> None:
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(RECORDER)
    (model_dir / "config.pbtxt").write_text(textwrap.dedent(f'''
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }},
                {{ name: "S" data_type: TYPE_STRING dims: [ 2 ] optional: true }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
        parameters {{ key: "LOG" value: {{ string_value: "{log}" }} }}
        ''') + warmup)
    for relative, data in (files or {}).items():
        path = model_dir / "warmup" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def executions(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_samples_run_on_every_instance_before_the_model_is_ready(tmp_path: Path, tserve) -> None:  # type: ignore[no-untyped-def]
    repo, log = tmp_path / "models", tmp_path / "executions.jsonl"
    values = np.arange(3, dtype=np.float32) + 1
    write_recorder(repo, "warm", log, instances=2, files={"x.bin": values.tobytes()}, warmup='''
model_warmup [
  { name: "zeros" batch_size: 2 count: 3
    inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } },
  { name: "skipped" batch_size: 0
    inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } },
  { name: "from_file" batch_size: 1
    inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "x.bin" } }
    inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] random_data: true } } }
]
''')
    server = tserve(repo, frontend_processes=0)
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("warm")
    runs = executions(log)
    for instance in {run["instance"] for run in runs}:
        mine = [run["requests"] for run in runs if run["instance"] == instance]
        # "zeros" three times as a batch of two requests of batch 1, then "from_file" once
        assert mine[:3] == [[{"X": [[1, 4], "float32", 0.0]}] * 2] * 3
        assert mine[3] == [{"X": [[1, 3], "float32", 1.0], "S": [[1, 2], "object", ""]}]
        assert len(mine) == 4
    assert len({run["instance"] for run in runs}) == 2
    stats = client.get_inference_statistics("warm")["model_stats"][0]
    assert stats["inference_count"] == 0  # warmup is not client traffic


def test_bytes_warmup_data_from_a_file(tmp_path: Path, tserve) -> None:  # type: ignore[no-untyped-def]
    repo, log = tmp_path / "models", tmp_path / "executions.jsonl"
    strings = b"".join(struct.pack("<I", len(s)) + s for s in (b"hello", b"world"))
    write_recorder(repo, "warm_bytes", log, max_batch_size=0, files={"s.bin": strings}, warmup='''
model_warmup [ { name: "text" batch_size: 1
    inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] random_data: true } }
    inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin" } } } ]
''')
    server = tserve(repo, frontend_processes=0)
    assert httpclient.InferenceServerClient(server.http_url).is_model_ready("warm_bytes")
    [run] = executions(log)
    [request] = run["requests"]
    assert request["S"] == [[2], "object", "hello"]  # no batch dimension: max_batch_size is 0
    assert request["X"][:2] == [[2], "float32"]


FAILURES = [
    ('{ name: "bad" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 1 ] '
     'input_data_file: "seven.bin" } } }', "failed to run warmup sample 'bad': X holds 7; "),
    ('{ name: "raises" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 1 ] '
     'input_data_file: "nine.bin" } } }', "failed to run warmup sample 'raises': "),
    ('{ name: "wild" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ -1 ] zero_data: true } } }',
     "warmup setting expects all variable-size dimensions are specified for input 'X'"),
    ('{ name: "unset" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 1 ] } } }',
     "warmup setting expects input 'X' to have input_data_type set"),
    ('{ name: "short" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] '
     'input_data_file: "seven.bin" } } }',
     "warmup setting expects 16 bytes, but the data provided from seven.bin only has 4 bytes"),
    ('{ name: "missing" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 1 ] '
     'input_data_file: "absent.bin" } } }', "failed to read warmup data file"),
]


@pytest.mark.parametrize(("sample", "message"), FAILURES, ids=[s.split('"')[1] for s, _ in FAILURES])
def test_a_failing_warmup_fails_the_load_and_the_client_sees_why(tmp_path: Path, tserve, sample: str,
                                                                  message: str) -> None:  # type: ignore[no-untyped-def]
    repo, log = tmp_path / "models", tmp_path / "executions.jsonl"
    files = {"seven.bin": np.float32([7]).tobytes(), "nine.bin": np.float32([9]).tobytes()}
    write_recorder(repo, "cold", log, files=files, warmup=f"model_warmup [ {sample} ]\n")
    server = tserve(repo, frontend_processes=0, model_control_mode="explicit")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match=message.replace("(", r"\(")):
        client.load_model("cold")
    assert not client.is_model_ready("cold")
    [entry] = client.get_model_repository_index().models
    assert entry.state == "UNAVAILABLE" and message in entry.reason
