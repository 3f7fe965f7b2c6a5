"""A served request is freed by reference counting the moment it is answered: nothing of it is left in a reference
cycle for the cyclic garbage collector, whose passes would otherwise cost every request several microseconds and
keep request bodies alive until they ran."""
from __future__ import annotations

import gc

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_serve._engine.frontend.grpc.native import Call, NativeContext
from triton_serve._engine.frontend.http.infer_protocol import InferExchange
from triton_serve._engine.inference import InferenceRequest, InferenceResponse, Tensor

from .conftest import ADD_SUB

OURS = (InferenceRequest, InferenceResponse, Tensor, InferExchange, Call, NativeContext)


def _inputs(module, binary: bool):  # type: ignore[no-untyped-def]
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")
        if module is httpclient:
            tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16), binary_data=binary)
        else:
            tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)
    return inputs


def test_answered_requests_leave_no_cyclic_garbage(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    server = toy_server()
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)

    def serve_some() -> None:
        for _ in range(10):
            for binary in (True, False):
                result = http.infer("add_sub", _inputs(httpclient, binary))
                assert result.as_numpy("OUTPUT0").tolist() == [list(range(0, 32, 2))]
            assert grpc.infer("add_sub", _inputs(grpcclient, True)).as_numpy("OUTPUT1").tolist() == [[0] * 16]

    serve_some()  # connections, caches and the first request's one-time objects
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        serve_some()
        gc.collect()
        left = sorted({type(item).__name__ for item in gc.garbage if isinstance(item, OURS)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []
