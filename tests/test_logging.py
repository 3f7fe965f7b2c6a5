"""Triton's logging extension: /v2/logging and gRPC LogSettings through tritonclient, the --log-* flags,
Triton's log line shapes, and changes reaching front-end processes and Python models. The servers run as
``triton-serve`` processes, so that their logging is their own."""
from __future__ import annotations

import calendar
import http.client
import importlib.util
import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from triton_serve._engine.cli import build_parser, main, options_from_args
from triton_serve._engine.log_settings import LogSettings, TritonLogFormatter, TritonLogHandler
from triton_serve.testing import free_port

from .conftest import FRONTEND_MODES, write_model

DEFAULT_LINE = re.compile(r'[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} (\d+) [\w.-]+:\d+\] ".*"')
ISO8601_LINE = re.compile(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] (\d+) [\w.-]+:\d+\] ".*"')
# Logs each request's X at info, warning and verbose level.
PYLOG_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        from tqdm import tqdm  # a library's progress bar, as weights loading draws one

        for _ in tqdm(range(3), desc="warming up"):
            pass

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            pb_utils.Logger.log_info(f"info {x[0]}")
            pb_utils.Logger.log_warn(f"warning {x[0]}")
            pb_utils.Logger.log_verbose(f"verbose {x[0]}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
"""
PYLOG_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_INT64, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT64, dims: [ 1 ] } ]
"""
HAS_PYTHON_BACKEND = importlib.util.find_spec("triton_serve_python") is not None


class ServerProcess:
    """``triton-serve`` in a process of its own, logging to ``log_file``."""

    def __init__(self, tmp: Path, frontend_processes: int, *flags: str) -> None:
        self.frontend_processes = frontend_processes
        self.log_file = tmp / "server.log"
        self.stderr_file = tmp / "stderr.txt"
        self.http_port, self.grpc_port = free_port(), free_port()
        with self.stderr_file.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from triton_serve._engine.cli import main; raise SystemExit(main())",
                 f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}", f"--metrics-port={free_port()}",
                 "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                 f"--frontend-processes={frontend_processes}", f"--log-file={self.log_file}", *flags],
                stdout=stderr, stderr=stderr)
        self.pid = self.process.pid
        deadline = time.monotonic() + 120
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"triton-serve did not become ready:\n{self.stderr_file.read_text()}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.http_port}/v2/health/ready").status_code == 200
        except httpx.TransportError:
            return False

    def http_client(self) -> httpclient.InferenceServerClient:
        return httpclient.InferenceServerClient(f"127.0.0.1:{self.http_port}")

    def grpc_client(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")

    def lines(self) -> list[str]:
        return self.log_file.read_text().splitlines()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module", params=FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("logging")
    write_model(tmp / "models", "pylog", PYLOG_CONFIG, files={"1/model.py": PYLOG_MODEL})
    running = ServerProcess(tmp, request.param, f"--model-repository={tmp / 'models'}", "--log-format=ISO8601",
                            "--log-verbose=0", "--log-info=true")
    yield running
    running.stop()


@pytest.fixture
def settings_restored(server: ServerProcess) -> Iterator[dict[str, Any]]:
    """The server's log settings before the test; they are put back after it."""
    before = server.http_client().get_log_settings()
    yield before
    server.http_client().update_log_settings({name: value for name, value in before.items() if name != "log_file"})


def grpc_settings(response: Any) -> dict[str, Any]:
    return {name: getattr(value, value.WhichOneof("parameter_choice")) for name, value in response.settings.items()}


def readiness_checks(server: ServerProcess, count: int) -> None:
    """``count`` readiness checks, each on a connection of its own (so both front-end processes get some)."""
    for _ in range(count):
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port)
        try:
            connection.request("GET", "/v2/health/ready")
            assert connection.getresponse().status == 200
        finally:
            connection.close()


def infer_pylog(server: ServerProcess, x: int) -> None:
    tensor = httpclient.InferInput("X", [1], "INT64")
    tensor.set_data_from_numpy(np.array([x], dtype=np.int64))
    assert server.http_client().infer("pylog", [tensor]).as_numpy("Y").tolist() == [x]


# ---- reading and changing the settings ----------------------------------------------------------------------

def test_flags_set_the_settings_the_api_reports(server: ServerProcess) -> None:
    expected = {"log_file": str(server.log_file), "log_info": True, "log_warning": True, "log_error": True,
                "log_verbose_level": 0, "log_format": "ISO8601"}
    assert server.http_client().get_log_settings() == expected
    assert grpc_settings(server.grpc_client().get_log_settings()) == expected
    assert "logging" in server.http_client().get_server_metadata()["extensions"]
    assert "logging" in server.grpc_client().get_server_metadata().extensions


def test_settings_round_trip_between_http_and_grpc(server: ServerProcess, settings_restored: dict[str, Any]) -> None:
    changed = server.http_client().update_log_settings({"log_warning": False, "log_verbose_level": 2})
    assert changed == {**settings_restored, "log_warning": False, "log_verbose_level": 2}
    assert grpc_settings(server.grpc_client().get_log_settings()) == changed
    change = {"log_warning": True, "log_error": False, "log_format": "default"}
    answer = server.grpc_client().update_log_settings(change)
    changed = {**changed, **change}
    assert grpc_settings(answer) == changed
    assert server.http_client().get_log_settings() == changed
    assert server.http_client().update_log_settings({"log_info": None, "log_file": None}) == changed  # null: unchanged
    assert server.http_client().update_log_settings({}) == changed


# ---- what the settings do to the log ---------------------------------------------------------------------------

def test_lines_have_tritons_shapes_and_go_to_the_log_file(server: ServerProcess,
                                                          settings_restored: dict[str, Any]) -> None:
    assert settings_restored["log_format"] == "ISO8601"  # --log-format=ISO8601
    server.http_client().update_log_settings({"log_verbose_level": 1})
    mark = len(server.lines())
    readiness_checks(server, 4)
    iso8601 = server.lines()[mark:]
    server.http_client().update_log_settings({"log_format": "default"})
    mark = len(server.lines())
    readiness_checks(server, 4)
    default = server.lines()[mark:]
    for lines, shape in ((iso8601, ISO8601_LINE), (default, DEFAULT_LINE)):
        assert any("HTTP request: GET /v2/health/ready" in line for line in lines)
        assert all(shape.fullmatch(line) for line in lines), lines
    assert any('"serving HTTP on 127.0.0.1:' in line for line in server.lines())
    assert "serving HTTP on" not in server.stderr_file.read_text()  # the log file has the log, not stderr


def test_each_event_is_one_line_and_progress_bars_stay_off_the_log(server: ServerProcess) -> None:
    text = server.log_file.read_text() + server.stderr_file.read_text()
    assert "warming up" not in text  # stderr is no terminal here
    assert "Started server process" not in text  # uvicorn's own lifecycle lines, once per socket it serves
    for event in ("serving HTTP on", "serving gRPC", "serving metrics on", "loaded 'pylog' version 1"):
        assert text.count(event) == 1, (event, text)


def test_verbose_level_reaches_every_process(server: ServerProcess, settings_restored: dict[str, Any]) -> None:
    def verbose_line_pids(since: int) -> set[int]:
        return {int(ISO8601_LINE.fullmatch(line)[1]) for line in server.lines()[since:]  # type: ignore[index]
                if "HTTP request: GET /v2/health/ready" in line}

    mark = len(server.lines())
    readiness_checks(server, 20)
    assert verbose_line_pids(mark) == set()
    server.http_client().update_log_settings({"log_verbose_level": 1})
    mark = len(server.lines())
    readiness_checks(server, 20)
    pids = verbose_line_pids(mark)
    if server.frontend_processes:
        assert len(pids) == 2 and server.pid not in pids  # both front-end processes log verbose lines now
    else:
        assert pids == {server.pid}
    server.grpc_client().update_log_settings({"log_verbose_level": 0})
    mark = len(server.lines())
    readiness_checks(server, 20)
    assert verbose_line_pids(mark) == set()


@pytest.mark.skipif(not HAS_PYTHON_BACKEND, reason="the python backend plugin is not installed")
def test_python_model_lines_obey_the_settings(server: ServerProcess, settings_restored: dict[str, Any]) -> None:
    def logged(text: str) -> bool:
        return any(re.search(rf' model\.py:\d+\] "{text}"$', line) for line in server.lines())

    infer_pylog(server, 1)
    assert logged("info 1") and logged("warning 1") and not logged("verbose 1")
    server.http_client().update_log_settings({"log_info": False, "log_verbose_level": 1})
    infer_pylog(server, 2)
    # Verbose lines follow the verbose level alone, as in Triton.
    assert not logged("info 2") and logged("warning 2") and logged("verbose 2")
    server.grpc_client().update_log_settings({"log_warning": False, "log_info": True, "log_verbose_level": 0})
    infer_pylog(server, 3)
    assert logged("info 3") and not logged("warning 3") and not logged("verbose 3")


# ---- bad input -------------------------------------------------------------------------------------------------

UNKNOWN = ("unknown log setting 'log_colour'; the settings are log_file, log_info, log_warning, log_error, "
           "log_verbose_level, log_format")


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"log_info": "false"}, "400", "expect boolean for 'log_info'"),
    ({"log_warning": 1}, "400", "expect boolean for 'log_warning'"),
    ({"log_verbose_level": -1}, "400", "expect int32 for 'log_verbose_level'"),
    ({"log_verbose_level": 1.5}, "400", "expect int32 for 'log_verbose_level'"),
    ({"log_verbose_level": True}, "400", "expect int32 for 'log_verbose_level'"),
    ({"log_format": 8601}, "400", "expect string for 'log_format'"),
    ({"log_format": "json"}, "400", "invalid argument for log_format, got: json"),
    ({"log_file": "/tmp/elsewhere.log"}, "501", "log file location can not be updated through network protocol"),
    ({"log_colour": True}, "400", UNKNOWN),
    ({"log_info": False, "log_verbose_level": 3, "log_format": "json"}, "400",
     "invalid argument for log_format, got: json"),  # all or nothing: log_info and the level stay as they are
])
def test_http_bad_settings_change_nothing(server: ServerProcess, body: dict[str, Any], status: str,
                                          message: str) -> None:
    client = server.http_client()
    before = client.get_log_settings()
    with pytest.raises(InferenceServerException) as raised:
        client.update_log_settings(body)
    assert (raised.value.status(), raised.value.message()) == (status, message)
    assert client.get_log_settings() == before


@pytest.mark.parametrize(("body", "status", "message"), [
    (b"log_info=false", 400, "failed to parse the request JSON buffer"),
    (b"[true]", 400, "request body must be a JSON object"),
])
def test_http_body_that_is_no_json_object(server: ServerProcess, body: bytes, status: int, message: str) -> None:
    reply = httpx.post(f"http://127.0.0.1:{server.http_port}/v2/logging", content=body)
    assert reply.status_code == status and reply.json()["error"].startswith(message)
    assert httpx.put(f"http://127.0.0.1:{server.http_port}/v2/logging").json() == {"error": "Method Not Allowed"}


Value = service_pb2.LogSettingsRequest.SettingValue


@pytest.mark.parametrize(("settings", "code", "message"), [
    ({"log_info": Value()}, grpc.StatusCode.INVALID_ARGUMENT, "expect boolean for 'log_info'"),
    ({"log_error": Value(string_param="false")}, grpc.StatusCode.INVALID_ARGUMENT, "expect boolean for 'log_error'"),
    ({"log_verbose_level": Value(bool_param=True)}, grpc.StatusCode.INVALID_ARGUMENT,
     "expect int32 for 'log_verbose_level'"),
    ({"log_format": Value(uint32_param=1)}, grpc.StatusCode.INVALID_ARGUMENT, "expect string for 'log_format'"),
    ({"log_format": Value(string_param="iso")}, grpc.StatusCode.INVALID_ARGUMENT,
     "invalid argument for log_format, got: iso"),
    ({"log_file": Value(string_param="")}, grpc.StatusCode.UNIMPLEMENTED,
     "log file location can not be updated through network protocol"),
    ({"log_colour": Value(bool_param=True)}, grpc.StatusCode.INVALID_ARGUMENT, UNKNOWN),
    ({"log_info": Value(bool_param=False), "log_format": Value(string_param="iso")},
     grpc.StatusCode.INVALID_ARGUMENT, "invalid argument for log_format, got: iso"),
])
def test_grpc_bad_settings_change_nothing(server: ServerProcess, settings: dict[str, Any], code: grpc.StatusCode,
                                          message: str) -> None:
    before = grpc_settings(server.grpc_client().get_log_settings())
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.LogSettings(service_pb2.LogSettingsRequest(settings=settings))
    assert (raised.value.code(), raised.value.details()) == (code, message)  # type: ignore[attr-defined]
    assert grpc_settings(server.grpc_client().get_log_settings()) == before


def test_grpc_client_with_a_setting_without_value(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as raised:
        server.grpc_client().update_log_settings({"log_warning": None})  # sends an empty SettingValue
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert raised.value.message() == "expect boolean for 'log_warning'"


# ---- flags and line shapes, without a server -------------------------------------------------------------------

def test_log_flags_parse_as_tritonserver_reads_them() -> None:
    args = build_parser().parse_args(["--log-verbose=true", "--log-info=false", "--log-warning=off", "--log-error",
                                      "--log-format=ISO8601", "--log-file=/var/log/triton.log"])
    assert options_from_args(args).log_settings == LogSettings(
        log_file="/var/log/triton.log", log_info=False, log_warning=False, log_error=True, log_verbose_level=1,
        log_format="ISO8601")
    assert options_from_args(build_parser().parse_args([])).log_settings == LogSettings()
    assert build_parser().parse_args(["--log-verbose=-2"]).log_verbose == 0
    for bad in (["--log-format=json"], ["--log-verbose=loud"], ["--log-info=maybe"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)


def test_a_log_file_that_cannot_be_opened_stops_the_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-directory" / "server.log"
    assert main([f"--log-file={missing}", f"--model-repository={tmp_path}"]) == 1
    assert f"error: failed to open log file '{missing}': No such file or directory" in capsys.readouterr().err


def record(level: int, message: str) -> logging.LogRecord:
    made = logging.LogRecord("triton_serve.test", level, "/src/triton_serve/server.py", 42, message, (), None)
    made.created = calendar.timegm((2026, 11, 23, 2, 30, 0)) + 0.123456
    made.process = 4321
    return made


def test_line_shapes_are_tritons() -> None:
    message = 'loaded "m"\nnext'
    assert TritonLogFormatter().format(record(logging.INFO, message)) == \
        'I1123 02:30:00.123456 4321 server.py:42] "loaded \\"m\\"\\nnext"'
    assert TritonLogFormatter("ISO8601").format(record(logging.WARNING, message)) == \
        '2026-11-23T02:30:00Z W 4321 server.py:42] "loaded \\"m\\"\\nnext"'
    assert TritonLogFormatter(escape=False).format(record(logging.ERROR, "plain")) == \
        "E1123 02:30:00.123456 4321 server.py:42] plain"
    assert TritonLogFormatter().format(record(logging.DEBUG, "v")).startswith("I1123 ")  # verbose lines are I


def test_escaping_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "0")
    handler = TritonLogHandler()
    handler.configure(LogSettings(log_format="ISO8601"))
    assert handler.format(record(logging.INFO, 'as "is"')) == '2026-11-23T02:30:00Z I 4321 server.py:42] as "is"'


def test_each_switch_lets_its_lines_through() -> None:
    handler = TritonLogHandler()
    levels = (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)

    def passed(settings: LogSettings, logger: str = "triton_serve.test") -> list[bool]:
        handler.configure(settings)
        lines = [record(level, "m") for level in levels]
        for line in lines:
            line.name = logger
        return [handler.filter(line) for line in lines]

    assert passed(LogSettings()) == [True, True, True, True, False]
    assert passed(LogSettings(log_error=False)) == [False, False, True, True, False]
    assert passed(LogSettings(log_warning=False)) == [True, True, False, True, False]
    assert passed(LogSettings(log_info=False, log_verbose_level=1)) == [True, True, True, False, True]
    assert passed(LogSettings(log_verbose_level=1), logger="triton_serve_python.model")[-1]
    assert not passed(LogSettings(log_verbose_level=1), logger="asyncio")[-1]  # not ours: no verbose lines
