"""The SageMaker listener (``--allow-sagemaker``): ``GET /ping``, ``POST /invocations`` and the multi-model
routes of Triton's SageMaker front-end, answered through the KServe v2 app over the data-plane seam."""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from ...seam import DataPlaneAPI
from .forwarding import ASGIApp, Receive, Scope, Send, forward, header, reply

log = logging.getLogger("triton_serve")

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
DEFAULT_MODEL_ENV = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
PING_MODE_ENV = "SAGEMAKER_TRITON_PING_MODE"
INFERENCE_TYPE_ENV = "SAGEMAKER_TRITON_INFERENCE_TYPE"  # Triton 2.56: what /invocations runs
INFERENCE_TYPES = ("infer", "generate", "generate_stream")
UNSPECIFIED_MODEL = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
TARGET_MODEL_HEADER = "X-Amzn-SageMaker-Target-Model"
MODELS_PATH = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")
# Error texts Triton's SageMaker front-end answers with 507 (out of memory) instead of 400.
OOM_MARKERS = ("CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory", "out of memory",
               "MemoryError", "OutOfMemory", "OOM", "Dst tensor is not initialized",
               "Src tensor is not initialized", "CNMEM_STATUS_OUT_OF_MEMORY", "CUDNN_STATUS_NOT_INITIALIZED",
               "CUBLAS_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_NOT_INITIALIZED", "Failed to allocate memory",
               "failed to allocate memory", "No space left on device")
MME_LOAD_UNSUPPORTED = ("triton-serve does not register SageMaker multi-model archives at run time: "
                        "put the models in a --model-repository and call /invocations")


@dataclass(frozen=True)
class SageMakerSettings:
    """What the listener reads from Triton's SageMaker environment variables (read once, by the CLI)."""

    default_model: str = UNSPECIFIED_MODEL  # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME
    ping_mode: str = "ready"  # SAGEMAKER_TRITON_PING_MODE: ready or live
    inference_type: str = "infer"  # SAGEMAKER_TRITON_INFERENCE_TYPE: infer, generate or generate_stream

    @classmethod
    def from_environment(cls) -> SageMakerSettings:
        return cls(os.environ.get(DEFAULT_MODEL_ENV, UNSPECIFIED_MODEL), os.environ.get(PING_MODE_ENV, "ready"),
                   os.environ.get(INFERENCE_TYPE_ENV, "infer"))


def out_of_memory_status(status: int, body: bytes) -> int:
    """507 for an error whose text says the server ran out of memory, as Triton's SageMaker front-end does."""
    text = body.decode("utf-8", "replace")
    return 507 if any(marker in text for marker in OOM_MARKERS) else status


def sagemaker_app(api: DataPlaneAPI, triton: ASGIApp, settings: SageMakerSettings) -> ASGIApp:
    """The SageMaker routes as an ASGI app; ``triton`` is the KServe v2 app that serves inference."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        log.debug("SageMaker request: %s %s", method, path)
        if path == "/ping":
            if method != "GET":
                await reply(send, 405, {"error": "Method Not Allowed"})
                return
            healthy = await (api.live() if settings.ping_mode == "live" else api.server_ready())
            await reply(send, 200 if healthy else 400)
        elif path == "/invocations":
            await _invocations(scope, receive, send, method)
        elif (match := MODELS_PATH.fullmatch(path)) is not None:
            await _multi_model(scope, receive, send, match[1] or "", match[2] or "")
        else:
            await reply(send, 400)

    async def _invocations(scope: Scope, receive: Receive, send: Send, method: str) -> None:
        kind = settings.inference_type
        if kind not in INFERENCE_TYPES:  # tritonserver answers each call so; Triton's serve script refuses to start
            await reply(send, 500, {"error": f"Server has invalid inference type '{kind}'. Must be one of: infer, "
                                             "generate, generate_stream."})
        elif kind == "infer":
            await forward(triton, scope, receive, send, path=f"/v2/models/{settings.default_model}/infer",
                          method=method, binary_mime=BINARY_MIME, status_of_error=out_of_memory_status)
        else:  # the generate extension's JSON (and server-sent events for generate_stream), as KServe v2 answers
            await forward(triton, scope, receive, send, path=f"/v2/models/{settings.default_model}/{kind}",
                          method=method)

    async def _multi_model(scope: Scope, receive: Receive, send: Send, name: str, action: str) -> None:
        # No archive is registered at run time (MME_LOAD_UNSUPPORTED), so the loaded list is always empty:
        # each route answers as Triton's does for a model it has not loaded.
        method = scope["method"]
        if method == "GET" and not name:
            await reply(send, 200, {"models": []})
        elif method == "POST" and not action:
            target = header(scope, TARGET_MODEL_HEADER)
            log.info("Loading SageMaker TargetModel: %s", target)
            await reply(send, 501, {"error": MME_LOAD_UNSUPPORTED})
        elif method in ("GET", "DELETE") or (method == "POST" and action == "/invoke"):
            await reply(send, 404)
        else:
            await reply(send, 400)

    return app
