"""The process boundary, kept: a front-end process imports the front-ends, the data-plane seam, the wire codecs and
the few modules both sides share, and none of the model owner's modules (repository, schedulers, data plane,
backends, plugin host, statistics, tracing, shared-memory registry...)."""
from __future__ import annotations

import subprocess
import sys

import pytest

ENGINE = "triton_serve._engine."
# What a front-end process may load. A module added here must not reach the model owner's state: it either
# translates a wire format, forwards calls through the seam, or is a plain definition both sides share.
FRONTEND_SIDE = {
    # the front-end process and its front-ends
    "frontend_process", "frontends", "restricted", "header_forwarding", "frontend_trace", "http_apps", "hookspecs",
    "http", "http.app", "http.codec", "http.disconnect", "http.error_guard", "http.generate", "http.generate_json",
    "http.infer_protocol", "http.serving", "http.shared_memory",
    "grpc_frontend", "grpc_frontend.codec", "grpc_frontend.health", "grpc_frontend.server", "grpc_frontend.service",
    "grpc_frontend.status", "grpc_frontend.stream",
    "platforms", "platforms.forwarding", "platforms.listeners", "platforms.sagemaker", "platforms.vertex_ai",
    "openai_listener",
    # the seam and the wire between the processes
    "seam", "channel", "wire",
    # plain definitions both sides share
    "errors", "inference", "datatypes", "shared_memory_parameters", "config", "load_overrides", "sources",
    "trace_settings", "log_settings", "protos", "protos.grpc_service_pb2", "protos.grpc_service_pb2_grpc",
    "protos.health_pb2", "protos.health_pb2_grpc", "protos.model_config_pb2",
}


def _engine_modules_loaded_by(module: str) -> set[str]:
    script = (f"import sys, {module}\n"
              f"print('\\n'.join(m[len('{ENGINE}'):] for m in sys.modules if m.startswith('{ENGINE}')))")
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return set(output.split())


def test_a_frontend_process_loads_no_module_of_the_model_owner() -> None:
    loaded = _engine_modules_loaded_by("triton_serve._engine.frontend_process")
    assert "frontend_process" in loaded and "http.infer_protocol" in loaded and "grpc_frontend.service" in loaded
    assert loaded - FRONTEND_SIDE == set(), "a front-end process imports the model owner's modules"


def test_the_openai_plugin_loads_no_module_of_the_model_owner() -> None:
    """A plugin app on the HTTP port (triton_serve.frontend's API) runs in every front-end process too."""
    pytest.importorskip("triton_serve_openai")
    loaded = _engine_modules_loaded_by("triton_serve._engine.frontend_process, triton_serve_openai.app")
    assert loaded - FRONTEND_SIDE == set(), "the OpenAI plugin imports the model owner's modules"


def test_the_rule_sees_an_owner_module() -> None:
    """The check itself: the data plane is the owner's, and importing it is seen."""
    assert {"dataplane", "repository", "scheduling"} <= _engine_modules_loaded_by("triton_serve._engine.dataplane") \
        - FRONTEND_SIDE
