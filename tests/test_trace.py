"""Triton's trace extension: trace settings over HTTP and gRPC, trace files in Triton's JSON shape,
sampling by rate and count, OpenTelemetry export with W3C context propagation, ``--trace-config``."""
from __future__ import annotations

import gzip
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)
from tritonclient.utils import InferenceServerException

from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve._engine.errors import ServerError
from triton_serve.testing import free_port
from triton_serve._engine.trace_settings import TraceConfig, trace_config_from_args, warn_deprecated_trace_flags
from triton_serve._engine.tracing import Tracer

from .conftest import ADD_SUB, FRONTEND_MODES
from .test_grpc_stream import SLOW

HTTP_STAMPS = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
               "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "INFER_RESPONSE_COMPLETE",
               "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_STAMPS = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *HTTP_STAMPS[2:-2], "GRPC_SEND_START", "GRPC_SEND_END"]
# A W3C traceparent as a caller's tracing library sends it: version, trace id, parent span id, flags.
CALLER_TRACE_ID = "0af7651916cd43dd8448eb211c12666c"
CALLER_SPAN_ID = "b7ad6b7169242424"


def trace_config(*settings: str) -> TraceConfig:
    """The TraceConfig that ``--trace-config=<setting>`` flags give, read by the CLI's parser."""
    return trace_config_from_args(build_parser().parse_args([f"--trace-config={s}" for s in settings]))


def wait_for(found: Callable[[], Any], what: str, timeout_s: float = 30) -> Any:
    """Poll until ``found()`` is truthy (traces are written once the front-end has sent the response)."""
    deadline = time.monotonic() + timeout_s
    while not (result := found()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return result


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def http_infer(url: str, request_id: str, headers: dict[str, str] | None = None) -> None:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        inputs.append(tensor)
    httpclient.InferenceServerClient(url).infer("add_sub", inputs, request_id=request_id, headers=headers)


def grpc_infer(url: str, request_id: str, headers: dict[str, str] | None = None) -> None:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        inputs.append(tensor)
    with grpcclient.InferenceServerClient(url) as client:
        client.infer("add_sub", inputs, request_id=request_id, headers=headers)


def traces_by_request(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each trace's records (model record first), keyed by the request id in its model record."""
    ids = {record["id"]: record["request_id"] for record in records if "model_name" in record}
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        found.setdefault(ids[record["id"]], []).append(record)
    return found


def stamp_names(records: list[dict[str, Any]]) -> list[str]:
    stamps = [record["timestamps"][0] for record in records if "timestamps" in record]
    assert [stamp["ns"] for stamp in stamps] == sorted(stamp["ns"] for stamp in stamps)  # in time order
    return [stamp["name"] for stamp in stamps]


def grpc_settings(response: Any) -> dict[str, list[str]]:
    return {name: list(value.value) for name, value in response.settings.items()}


# ---- settings ----------------------------------------------------------------------------------

@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES)
def test_settings_round_trip_with_model_override_and_clear(add_model, toy_server,  # type: ignore[no-untyped-def]
                                                           tmp_path: Path) -> None:
    add_model("add_sub", ADD_SUB)
    path = tmp_path / "trace.json"
    server = toy_server(trace_config=trace_config("level=TIMESTAMPS", "rate=4", f"triton,file={path}"))
    http = httpclient.InferenceServerClient(server.http_url)
    start = {"trace_level": ["TIMESTAMPS"], "trace_rate": "4", "trace_count": "-1", "log_frequency": "0",
             "trace_file": str(path), "trace_mode": "triton"}
    assert http.get_trace_settings() == start
    assert http.get_trace_settings("add_sub") == start  # no setting of its own: the global one
    assert "trace" in http.get_server_metadata()["extensions"]

    changed = http.update_trace_settings("add_sub", {"trace_rate": "2", "trace_level": ["TIMESTAMPS", "TENSORS"]})
    assert changed == {**start, "trace_rate": "2", "trace_level": ["TIMESTAMPS", "TENSORS"]}
    assert http.get_trace_settings() == start
    # The global setting changes the fields the model does not set itself.
    http.update_trace_settings(settings={"trace_count": "10", "log_frequency": "3"})
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        model = {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": ["2"], "trace_count": ["10"],
                 "log_frequency": ["3"], "trace_file": [str(path)], "trace_mode": ["triton"]}
        assert grpc_settings(grpc.get_trace_settings("add_sub")) == model
        # A setting named without a value (null over HTTP) clears the model's own value.
        cleared = grpc.update_trace_settings("add_sub", {"trace_rate": None})
        assert grpc_settings(cleared) == {**model, "trace_rate": ["4"]}
        assert grpc_settings(grpc.update_trace_settings(settings={"trace_rate": "5"}))["trace_rate"] == ["5"]
        assert grpc_settings(grpc.get_trace_settings("add_sub"))["trace_rate"] == ["5"]
    assert http.update_trace_settings("add_sub", {"trace_level": None})["trace_level"] == ["TIMESTAMPS"]
    # Cleared global fields return to their start-up values.
    cleared = {"trace_rate": None, "trace_count": None, "log_frequency": None}
    assert http.update_trace_settings(settings=cleared) == start
    assert http.get_trace_settings("add_sub") == start


# ---- trace files -------------------------------------------------------------------------------

@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES)
def test_traced_requests_write_their_timestamps_in_order(add_model, toy_server,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    add_model("add_sub", ADD_SUB)
    path = tmp_path / "trace.json"
    server = toy_server(trace_config=trace_config(f"triton,file={path}"))  # tracing off
    http_infer(server.http_url, "untraced")
    client = httpclient.InferenceServerClient(server.http_url)
    # Turned on at run time: every front-end (process) notes its timestamps from now on.
    client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"})
    http_infer(server.http_url, "over-http")
    first = wait_for(lambda: read_json(Path(f"{path}.0")), "the first trace file")
    client.update_trace_settings("add_sub", {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    grpc_infer(server.grpc_url, "over-grpc")
    second = wait_for(lambda: read_json(Path(f"{path}.1")), "the second trace file")

    traces = traces_by_request(first + second)  # one trace per file (log_frequency 1)
    assert sorted(traces) == ["over-grpc", "over-http"]
    over_http, over_grpc = traces["over-http"], traces["over-grpc"]
    assert over_http[2] == {"id": over_http[0]["id"], "model_name": "add_sub", "model_version": 1,
                            "request_id": "over-http"}  # just before REQUEST_START
    assert stamp_names(over_http) == HTTP_STAMPS
    assert stamp_names(over_grpc) == GRPC_STAMPS
    tensors = [(r["activity"], r["tensor"]) for r in over_grpc if "activity" in r]
    ones, twos, zeros = (",".join([value] * 16) for value in ("1", "2", "0"))
    assert tensors == [
        ("TENSOR_QUEUE_INPUT", {"name": "INPUT0", "data": ones, "shape": "1,16", "dtype": "INT32"}),
        ("TENSOR_QUEUE_INPUT", {"name": "INPUT1", "data": ones, "shape": "1,16", "dtype": "INT32"}),
        ("TENSOR_BACKEND_OUTPUT", {"name": "OUTPUT0", "data": twos, "shape": "1,16", "dtype": "INT32"}),
        ("TENSOR_BACKEND_OUTPUT", {"name": "OUTPUT1", "data": zeros, "shape": "1,16", "dtype": "INT32"})]
    assert over_http[0]["id"] != over_grpc[0]["id"]


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES)
def test_a_request_its_client_gave_up_on_is_still_traced(add_model, toy_server,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    add_model("slow", SLOW.replace('"0.3"', '"0.6"'))
    path = tmp_path / "trace.json"
    server = toy_server(trace_config=trace_config("level=TIMESTAMPS", "rate=1", f"triton,file={path}",
                                                  "triton,log-frequency=1"))
    tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.infer("slow", [tensor], request_id="gave-up", client_timeout=0.1)
    # The call ended long before the model answered; the trace waits for both.
    names = stamp_names(wait_for(lambda: read_json(Path(f"{path}.0")), "the trace of the abandoned request"))
    assert {"GRPC_WAITREAD_START", "GRPC_SEND_END", "COMPUTE_END", "REQUEST_END"} <= set(names)


def test_rate_and_count_pick_the_traced_requests(add_model, toy_server,  # type: ignore[no-untyped-def]
                                                 tmp_path: Path) -> None:
    add_model("add_sub", ADD_SUB)
    path = tmp_path / "trace.json"
    server = toy_server(trace_config=trace_config("level=TIMESTAMPS", "rate=2", "count=2", f"triton,file={path}"))
    client = httpclient.InferenceServerClient(server.http_url)
    for number in range(1, 7):
        http_infer(server.http_url, str(number))
    assert client.get_trace_settings()["trace_count"] == "0"  # every 2nd request, 2 of them
    # A changed setting saves the traces collected under the old one to the trace file.
    client.update_trace_settings(settings={"trace_rate": "1", "trace_count": "2"})
    assert list(traces_by_request(wait_for(lambda: read_json(path), "the trace file"))) == ["2", "4"]
    for number in range(7, 10):
        http_infer(server.http_url, str(number))
    # The count ran out with every sampled trace collected: they go to <file>.0 at once.
    assert list(traces_by_request(wait_for(lambda: read_json(Path(f"{path}.0")), "<file>.0"))) == ["7", "8"]
    assert client.get_trace_settings()["trace_count"] == "0"


# ---- OpenTelemetry -----------------------------------------------------------------------------

class OtlpReceiver:
    """A tiny OTLP/HTTP trace receiver on a loopback port: keeps every exported span with its resource."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Any]] = []  # (resource attributes, span)
        received = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
                    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                    received.extend((resource, span) for scope in resource_spans.scope_spans for span in scope.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"127.0.0.1:{self.server.server_address[1]}/v1/traces"  # Triton's form: no scheme
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


def attributes(span: Any) -> dict[str, Any]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES)
def test_opentelemetry_spans_continue_the_callers_trace(otlp_receiver: OtlpReceiver,  # outlives the server
                                                        add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    # rate=0: only requests that carry a trace context are traced (Triton's way to trace just those).
    server = toy_server(trace_config=trace_config(
        "mode=opentelemetry", "level=TIMESTAMPS", "rate=0", f"opentelemetry,url={otlp_receiver.url}",
        "opentelemetry,resource=test.attribute=yes", "opentelemetry,bsp_schedule_delay=50"))
    assert httpclient.InferenceServerClient(server.http_url).get_trace_settings() == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "0", "trace_count": "-1", "trace_mode": "opentelemetry",
        "url": otlp_receiver.url, "resource": "test.attribute=yes", "bsp_schedule_delay": "50",
        "bsp_max_queue_size": "2048", "bsp_max_export_batch_size": "512"}
    http_infer(server.http_url, "no-context")
    callers = {"http": "1" * 32, "grpc": "2" * 32}
    http_infer(server.http_url, "over-http", {"traceparent": f"00-{callers['http']}-{CALLER_SPAN_ID}-01"})
    grpc_infer(server.grpc_url, "over-grpc", {"traceparent": f"00-{callers['grpc']}-{CALLER_SPAN_ID}-01"})
    wait_for(lambda: sum(span.name == "compute" for _, span in otlp_receiver.spans) == 2, "both traces' spans")

    for protocol, caller in callers.items():
        spans = {span.name: (resource, span) for resource, span in otlp_receiver.spans
                 if span.trace_id.hex() == caller}
        assert sorted(spans) == ["InferRequest", "add_sub", "compute"]
        resource, root = spans["InferRequest"]
        assert resource["service.name"] == "triton-inference-server" and resource["test.attribute"] == "yes"
        assert root.parent_span_id.hex() == CALLER_SPAN_ID  # a child of the caller's span
        assert root.kind == root.SPAN_KIND_SERVER
        front_end = [event.name for event in root.events]
        assert front_end[0] == ("HTTP_RECV_START" if protocol == "http" else "GRPC_WAITREAD_START")
        assert front_end[-1] == f"{protocol.upper()}_SEND_END"
        model, compute = spans["add_sub"][1], spans["compute"][1]
        assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
        assert attributes(model) == {"triton.model_name": "add_sub", "triton.model_version": 1,
                                     "triton.trace_id": attributes(model)["triton.trace_id"],
                                     "triton.trace_parent_id": 0, "triton.request_id": f"over-{protocol}"}
        assert [event.name for event in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        assert [event.name for event in compute.events] == ["COMPUTE_START", "COMPUTE_INPUT_END",
                                                            "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    assert {span.trace_id.hex() for _, span in otlp_receiver.spans} == set(callers.values())  # no-context: none


def test_opentelemetry_mode_without_its_packages_is_a_start_up_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ServerError, match=r"pip install 'triton-serve\[trace\]'"):
        Tracer(trace_config("mode=opentelemetry"))


# ---- bad input ---------------------------------------------------------------------------------

BAD_HTTP_UPDATES = [
    ({"trace_level": ["LOUD"]}, 400, "Unable to parse 'trace_level', expect OFF, TIMESTAMPS or TENSORS, got: LOUD"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified"),
    ({"trace_level": "TIMESTAMPS"}, 500, "attempt to access JSON non-array as array"),
    ({"trace_rate": "often"}, 400, "Unable to parse 'trace_rate', got: often"),
    ({"trace_rate": 5}, 500, "attempt to access JSON non-string as string"),
    ({"trace_rate": "10000000000"}, 400,
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 10000000000"),
    ({"trace_count": "-2"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
    ({"log_frequency": "x"}, 400, "Unable to parse 'log_frequency', got: x"),
    ({"trace_rate": "0"}, 400, "Attempting to set invalid trace setting :sample rate must be non-zero"),
    ({"trace_file": "/tmp/elsewhere.json"}, 501, "trace file location can not be updated through network protocol"),
]


BAD_GRPC_UPDATES = [
    ({"trace_rate": ["1", "2"]}, "INVALID_ARGUMENT", "expect only 1 value for 'trace_rate'"),
    ({"trace_count": "-2"}, "INVALID_ARGUMENT", "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
    ({"trace_level": "LOUD"}, "INVALID_ARGUMENT",
     "Unable to parse 'trace_level', expect OFF, TIMESTAMPS or TENSORS, got: LOUD"),
    ({"trace_file": "x"}, "UNIMPLEMENTED", "trace file location can not be updated through network protocol"),
]


def test_bad_settings_are_refused_with_tritons_errors(add_model, toy_server,  # type: ignore[no-untyped-def]
                                                      tmp_path: Path) -> None:
    add_model("add_sub", ADD_SUB)
    path = tmp_path / "trace.json"
    server = toy_server(trace_config=trace_config("level=TIMESTAMPS", f"triton,file={path}"))
    client = httpclient.InferenceServerClient(server.http_url)
    before = client.get_trace_settings()
    for update, status, message in BAD_HTTP_UPDATES:
        with pytest.raises(InferenceServerException) as raised:
            client.update_trace_settings("add_sub", update)
        assert (raised.value.status(), raised.value.message()) == (str(status), message), update
    assert client.get_trace_settings("add_sub") == before  # nothing changed
    with pytest.raises(InferenceServerException, match="Request for unknown model : missing"):
        client.get_trace_settings("missing")
    versioned = httpx.get(f"http://{server.http_url}/v2/models/add_sub/versions/1/trace/setting")
    assert (versioned.status_code, versioned.json()) == (404, {"error": "Not Found"})  # no versioned form
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        for update, code, message in BAD_GRPC_UPDATES:
            with pytest.raises(InferenceServerException) as raised:
                grpc.update_trace_settings("add_sub", update)
            assert (raised.value.status(), raised.value.message()) == (f"StatusCode.{code}", message)
        with pytest.raises(InferenceServerException, match="Request for unknown model : missing"):
            grpc.get_trace_settings("missing")


@pytest.mark.parametrize(("flags", "message"), [
    (["--trace-config=rate"], "argument --trace-config: --trace-config option format is "
                              "'<trace mode>,<setting>=<value>'. Got rate"),
    (["--trace-config=jaeger,url=x"], 'argument --trace-config: invalid value for trace mode option: jaeger. '
                                      'Available options are "triton" and "opentelemetry"'),
    (["--trace-config=,rate=1"], "argument --trace-config: No trace mode specified."),
    (["--trace-config=level=LOUD"], 'Bad option: "--trace-config level".\n'
                                    "invalid value for trace level option: loud"),
    (["--trace-config=rate=often"], 'Bad option: "--trace-config rate".\nInvalid option value. Got often'),
    (["--trace-config=triton,log-frequency=-1"], 'Bad option: "--trace-config triton,log-frequency".\n'
                                                 "Provided option value is out of bound. Got -1"),
    (["--trace-config=opentelemetry,resource=x", "--trace-config=mode=opentelemetry"],
     'Bad option: "--trace-config opentelemetry,resource".\nexpected <key>=<value>, got x'),
    (["--trace-level=LOUD"], "argument --trace-level: invalid value for trace level option: loud"),
])
def test_a_malformed_trace_flag_is_a_start_up_error(flags: list[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Syntax errors stop argparse (exit 2); bad values raise the ServerError that main prints (exit 1)."""
    with pytest.raises((SystemExit, ServerError)) as raised:
        options_from_args(build_parser().parse_args(flags))
    error = raised.value
    assert message in (error.message if isinstance(error, ServerError) else capsys.readouterr().err)


def test_trace_config_follows_tritons_rules(caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args([
        "--trace-file=/tmp/old.json", "--trace-rate=10", "--trace-level=TIMESTAMPS", "--trace-config=rate=100",
        "--trace-config=level=TENSORS", "--trace-config=triton,file=/tmp/new.json", "--trace-config=triton,x=y"])
    config = trace_config_from_args(args)
    assert (config.level, config.rate, config.count, config.file) == (3, 100, -1, "/tmp/new.json")
    assert config.options == (("file", "/tmp/new.json"), ("x", "y"))
    assert trace_config("level=TIMESTAMPS", "level=OFF").level == 0  # any OFF turns tracing off
    assert trace_config("mode=opentelemetry", "triton,file=/tmp/t.json").file == ""  # the other mode's: unused
    with caplog.at_level(logging.WARNING, logger="triton_serve"):
        warn_deprecated_trace_flags(args)
    assert [record.getMessage() for record in caplog.records] == [
        "'--trace-file' has been deprecated and will be removed in future releases. Please use "
        "'--trace-config triton,file=<filepath>' instead.",
        "'--trace-level' has been deprecated and will be removed in future releases. Please use "
        "'--trace-config level=<OFF|TIMESTAMPS|TENSORS>' instead.",
        "'--trace-rate' has been deprecated and will be removed in future releases. Please use "
        "'--trace-config rate=<rate value>' instead."]
