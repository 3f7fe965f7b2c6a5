"""The process boundaries, kept: a front-end process imports the front-end package, the data-plane seam, the wire
codecs and the few modules both sides share, and none of the model owner's modules (repository, schedulers, data plane,
backends, plugin host, statistics, tracing, shared-memory registry...); a model's worker process imports
``triton_serve.worker``, which loads none of the server's protocol, metrics or plugin-host packages."""
from __future__ import annotations

import subprocess
import sys

import pytest

ENGINE = "triton_serve._engine."
# A front-end process loads the front-end package (``triton_serve._engine.frontend``) and beside it only these: the
# seam and the wire between the processes, and plain definitions both sides share. A module added here must not
# reach the model owner's state.
BESIDE_THE_FRONTENDS = {
    "seam", "channel", "wire",
    "errors", "inference", "datatypes", "shared_memory_parameters", "config", "load_overrides", "sources",
    "trace_settings", "log_settings", "subscribers", "request_json", "hookspecs", "poll_window",
    "protos", "protos.grpc_service_pb2", "protos.grpc_service_pb2_grpc", "protos.health_pb2", "protos.health_pb2_grpc",
    "protos.model_config_pb2",
}


def _owner_modules(loaded: set[str]) -> set[str]:
    return {m for m in loaded if m != "frontend" and not m.startswith("frontend.")} - BESIDE_THE_FRONTENDS


# What a worker process never loads: the server's protocol stacks, its metrics and its plugin host.
SERVER_PACKAGES = {"grpc", "starlette", "uvicorn", "prometheus_client", "pluggy"}


def _modules_loaded_by(module: str) -> set[str]:
    """The modules a fresh interpreter holds after importing ``module`` (comma-separated modules: each)."""
    script = f"import sys, {module}\nprint('\\n'.join(sys.modules))"
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return set(output.split())


def _engine_modules_loaded_by(module: str) -> set[str]:
    return {m[len(ENGINE):] for m in _modules_loaded_by(module) if m.startswith(ENGINE)}


def _server_packages_loaded_by(module: str) -> set[str]:
    return {m for m in _modules_loaded_by(module) if m.partition(".")[0] in SERVER_PACKAGES}


def test_a_frontend_process_loads_no_module_of_the_model_owner() -> None:
    loaded = _engine_modules_loaded_by("triton_serve._engine.frontend.process")
    assert {"frontend.process", "frontend.http.infer_protocol", "frontend.grpc.native"} <= loaded
    assert _owner_modules(loaded) == set(), "a front-end process imports the model owner's modules"


def test_the_openai_plugin_loads_no_module_of_the_model_owner() -> None:
    """A plugin app on the HTTP port (triton_serve.frontend's API) runs in every front-end process too."""
    pytest.importorskip("triton_serve_openai")
    loaded = _engine_modules_loaded_by("triton_serve._engine.frontend.process, triton_serve_openai.app")
    assert _owner_modules(loaded) == set(), "the OpenAI plugin imports the model owner's modules"


def test_the_rule_sees_an_owner_module() -> None:
    """The check itself: the data plane is the owner's, and importing it is seen."""
    assert {"dataplane", "repository", "scheduling"} <= _owner_modules(
        _engine_modules_loaded_by("triton_serve._engine.dataplane"))


def test_the_worker_api_loads_none_of_the_server() -> None:
    loaded = _modules_loaded_by("triton_serve.worker")
    assert "triton_serve._engine.wire" in loaded and "triton_serve.plugin" not in loaded
    assert {m for m in loaded if m.partition(".")[0] in SERVER_PACKAGES} == set()


@pytest.mark.parametrize("worker", ["triton_serve_python.worker", "triton_serve_python.autocomplete_process",
                                    "triton_serve_pytriton.isolation", "triton_serve_pytriton.decorators"])
def test_a_model_worker_process_loads_none_of_the_server(worker: str) -> None:
    """The Python backend's worker (and its auto-complete process), PyTriton's isolated worker and the decorators
    a function it loads uses: each imports ``triton_serve.worker``, not ``triton_serve.plugin``."""
    pytest.importorskip(worker.partition(".")[0])
    assert _server_packages_loaded_by(worker) == set(), f"{worker} loads the server's packages"


def test_the_worker_rule_sees_the_server() -> None:
    """The check itself: the plugin API brings the plugin host and the protocol stacks."""
    assert {"pluggy", "grpc", "starlette"} <= {m.partition(".")[0] for m in _server_packages_loaded_by(
        "triton_serve.plugin")}
