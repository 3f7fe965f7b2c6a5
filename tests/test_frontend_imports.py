"""The process boundary, kept: a front-end process imports the front-end package, the data-plane seam, the wire
codecs and the few modules both sides share, and none of the model owner's modules (repository, schedulers, data plane,
backends, plugin host, statistics, tracing, shared-memory registry...)."""
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
    "trace_settings", "log_settings", "hookspecs", "protos", "protos.grpc_service_pb2", "protos.grpc_service_pb2_grpc",
    "protos.health_pb2", "protos.health_pb2_grpc", "protos.model_config_pb2",
}


def _owner_modules(loaded: set[str]) -> set[str]:
    return {m for m in loaded if m != "frontend" and not m.startswith("frontend.")} - BESIDE_THE_FRONTENDS


def _engine_modules_loaded_by(module: str) -> set[str]:
    script = (f"import sys, {module}\n"
              f"print('\\n'.join(m[len('{ENGINE}'):] for m in sys.modules if m.startswith('{ENGINE}')))")
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return set(output.split())


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
