"""Every tritonserver 2.51 flag is accepted, so a Triton launch command line starts triton-serve unchanged:
the ones triton-serve acts on behave as Triton's, the others each log one warning naming them."""
from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve._engine.cli import IGNORED_FLAGS, build_parser, options_from_args, warn_ignored_flags

from .test_grpc_stream import SLOW

# A launch line as Triton's own docs and deployment scripts write them (one of every 2.51 flag).
TRITON_COMMAND_LINE = [
    "--id=inference-1", "--exit-timeout-secs=5", "--log-verbose=0", "--log-info=true", "--log-warning=true",
    "--log-error=true", "--log-format=default", "--log-file=/tmp/triton.log", "--model-store=/models",
    "--exit-on-error=false", "--disable-auto-complete-config", "--strict-readiness=true",
    "--model-control-mode=explicit", "--repository-poll-secs=15", "--load-model=*", "--model-config-name=h100",
    "--model-load-thread-count=4", "--model-load-retry-count=0", "--model-namespacing=false",
    "--enable-peer-access=true", "--allow-http=true", "--http-address=0.0.0.0", "--http-port=8000",
    "--reuse-http-port=false", "--http-header-forward-pattern=x-.*", "--http-thread-count=8",
    "--http-restricted-api=model-repository:admin-key=secret", "--allow-grpc=true", "--grpc-address=0.0.0.0",
    "--grpc-port=8001", "--reuse-grpc-port=false", "--grpc-header-forward-pattern=x-.*",
    "--grpc-infer-allocation-pool-size=8", "--grpc-use-ssl=false", "--grpc-use-ssl-mutual=false",
    "--grpc-infer-response-compression-level=none", "--grpc-keepalive-time=7200000",
    "--grpc-keepalive-timeout=20000", "--grpc-keepalive-permit-without-calls=false",
    "--grpc-http2-max-pings-without-data=2", "--grpc-http2-min-recv-ping-interval-without-data=300000",
    "--grpc-http2-max-ping-strikes=2", "--grpc-restricted-protocol=health:k=v", "--allow-sagemaker=false",
    "--sagemaker-port=8080", "--sagemaker-safe-port-range=8081-8085", "--sagemaker-thread-count=8",
    "--allow-vertex-ai=false", "--vertex-ai-port=8080", "--vertex-ai-thread-count=8",
    "--vertex-ai-default-model=m", "--allow-metrics=true", "--allow-gpu-metrics=false", "--allow-cpu-metrics=true",
    "--metrics-address=0.0.0.0", "--metrics-port=8002", "--metrics-interval-ms=2000",
    "--metrics-config=summary_latencies=true", "--trace-config=triton,file=/tmp/trace.json",
    "--backend-directory=/opt/tritonserver/backends", "--backend-config=python,shm-default-byte-size=1048576",
    "--backend-config=default-max-batch-size=4", "--repoagent-directory=/opt/tritonserver/repoagents",
    "--cache-config=local,size=1048576", "--cache-directory=/opt/tritonserver/caches", "--rate-limit=off",
    "--rate-limit-resource=R1:10:0", "--pinned-memory-pool-byte-size=268435456",
    "--cuda-memory-pool-byte-size=0:67108864", "--cuda-virtual-address-size=0:1073741824",
    "--min-supported-compute-capability=6.0", "--buffer-manager-thread-count=0",
    "--host-policy=numa0,numa-node=0", "--model-load-gpu-limit=0:0.9", "--strict-model-config=false",
    "--trace-file=/tmp/t.json", "--trace-level=OFF", "--trace-rate=1000", "--trace-count=-1",
    "--trace-log-frequency=0",
    "--grpc-infer-thread-count=4",  # Triton 2.57
    "--grpc-max-response-pool-size=16",  # Triton 2.56
]


def test_a_triton_command_line_parses_and_names_each_ignored_flag(caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args(TRITON_COMMAND_LINE)
    options = options_from_args(args)
    assert options.model_repositories == ["/models"] and options.exit_timeout_secs == 5
    assert options.server_id == "inference-1"
    assert options.model_control_mode == "explicit" and options.load_models == ["*"]
    assert options.cache_config == ("local", {"size": "1048576"})
    assert options.backend_config == {"python": {"shm-default-byte-size": "1048576"},
                                      "": {"default-max-batch-size": "4"}}
    with caplog.at_level(logging.WARNING, logger="triton_serve"):
        warn_ignored_flags(args)
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == len(IGNORED_FLAGS)  # one line per flag
    for (_group, name, _metavar, _why), line in zip(IGNORED_FLAGS, warned):
        assert line.startswith(f"{name} is accepted for tritonserver compatibility but has no effect: ")


def test_allow_client_shm_keeps_2_51s_default_and_thread_count_checks_tritons_range() -> None:
    parser = build_parser()
    assert options_from_args(parser.parse_args([])).allow_client_shm is True
    assert options_from_args(parser.parse_args(["--allow-client-shm=false"])).allow_client_shm is False
    assert options_from_args(parser.parse_args(["--allow-client-shm"])).allow_client_shm is True
    for bad in ("1", "129", "two"):
        with pytest.raises(SystemExit):
            parser.parse_args([f"--grpc-infer-thread-count={bad}"])
    assert parser.parse_args(["--grpc-infer-thread-count=128"]).grpc_infer_thread_count == "128"
    for bad in ("0", "-3", "many"):
        with pytest.raises(SystemExit):
            parser.parse_args([f"--grpc-max-response-pool-size={bad}"])
    assert parser.parse_args(["--grpc-max-response-pool-size=1"]).grpc_max_response_pool_size == "1"


def test_help_groups_flags_as_tritonserver_does() -> None:
    text = build_parser().format_help()
    titles = ["Server:", "Logging:", "Model Repository:", "HTTP:", "GRPC:", "Metrics:", "Tracing:", "Backend:",
              "Response Cache:", "Rate Limiter:", "DEPRECATED:"]
    positions = [text.index(f"\n{title}\n") for title in titles]
    assert positions == sorted(positions)
    assert text.index("\n  --backend-directory") > text.index("\nBackend:\n")


def test_global_and_per_backend_config_are_kept_apart() -> None:  # parsed per backend: test_backend_options
    args = build_parser().parse_args(["--backend-config=default-max-batch-size=4",
                                      "--backend-config=toy_identity,default-max-batch-size=2",
                                      "--backend-config=toy_identity,label=a,b"])
    assert options_from_args(args).backend_config == {"": {"default-max-batch-size": "4"},
                                                      "toy_identity": {"default-max-batch-size": "2", "label": "a,b"}}


def test_response_cache_byte_size_is_the_local_cache() -> None:
    options = options_from_args(build_parser().parse_args(["--response-cache-byte-size=4096"]))
    assert options.cache_config == ("local", {"size": "4096"})


def test_exit_timeout_bounds_the_drain(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("slow", SLOW.replace('"0.3"', '"600"'))  # an in-flight request that would take 10 minutes
    server = toy_server(exit_timeout_secs=1)
    outcome: list[object] = []

    def call() -> None:
        tensor = httpclient.InferInput("INPUT0", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        try:
            outcome.append(httpclient.InferenceServerClient(server.http_url, network_timeout=120).infer("slow", [tensor]))
        except (InferenceServerException, OSError) as error:
            outcome.append(error)

    caller = threading.Thread(target=call)
    caller.start()
    while not server.server.repository.models["slow"].versions[1].stats.dequeued:  # the request is running
        caller.join(0.01)
    server.stop()  # returns because the drain gives up after 1 s (and the unload after 1 s)
    caller.join(60)
    assert not caller.is_alive() and len(outcome) == 1 and isinstance(outcome[0], Exception)


def test_id_names_the_server_in_its_metadata(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    server = toy_server(server_id="inference-1")
    assert httpclient.InferenceServerClient(server.http_url).get_server_metadata()["name"] == "inference-1"
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.get_server_metadata().name == "inference-1"


def _run_cli(repository: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``python -m triton_serve`` on ``repository`` with ``flags``, on ports the OS picks; it must exit by itself."""
    return subprocess.run([sys.executable, "-m", "triton_serve", f"--model-repository={repository}", *flags,
                           "--http-port=0", "--grpc-port=0", "--metrics-port=0", "--frontend-processes=0"],
                          capture_output=True, text=True, timeout=60)


NEEDS_EXPLICIT = "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."


@pytest.mark.parametrize(("flags", "line"), [
    (["--load-model=m"], NEEDS_EXPLICIT),
    (["--model-control-mode=poll", "--load-model=*"], NEEDS_EXPLICIT),
    (["--model-control-mode=explicit", "--load-model=*", "--load-model=m"], "error: creating server: Invalid argument - "
     "Wildcard model name '*' must be the ONLY startup model if specified at all."),
    (["--model-control-mode=explicit", "--load-model=missing"], "error: failed to load all models"),
], ids=["without-explicit", "poll-mode", "wildcard-and-a-name", "unknown-name"])
def test_startup_models_are_checked_as_tritonserver_checks_them(tmp_path: Path, flags: list[str], line: str) -> None:
    """tritonserver's texts on stderr, exit code 1, no traceback: a parse error alone (its ParseException), a
    wildcard beside a name as its 'creating server' error, an unknown name logged as its poll failure."""
    finished = _run_cli(tmp_path, *flags)
    assert finished.returncode == 1
    assert finished.stderr.splitlines()[-1] == line
    assert "Traceback" not in finished.stderr
    if flags[-1] == "--load-model=missing":
        assert "failed to poll model 'missing': model not found in any model repository." in finished.stderr
