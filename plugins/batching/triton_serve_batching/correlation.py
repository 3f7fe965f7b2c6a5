"""Correlation IDs: which sequence a request belongs to, and the IDs the sequence batcher accepts."""
from __future__ import annotations

from triton_serve.plugin import InferenceRequest, ServerError, TensorType

CorrelationId = int | str


def check_correlation_id(request: InferenceRequest, corrid_input: tuple[str, TensorType] | None) -> None:
    """Reject, in Triton's words, a request without a correlation ID or with one the model's CORRID
    control input (its name and type; None when the model has none) cannot carry."""
    model, corrid = request.model_name, request.sequence_id
    if corrid == 0 or corrid == "":
        raise ServerError(f"inference request to model '{model}' must specify a non-zero or non-empty "
                          "correlation ID")
    if isinstance(corrid, int) and not 0 < corrid < 2 ** 64:
        raise ServerError(f"inference request to model '{model}' has correlation ID {corrid}, "
                          "which is not an unsigned 64-bit integer")
    if isinstance(corrid, str) and corrid_input is not None and corrid_input[1].name != "BYTES":
        name, datatype = corrid_input
        raise ServerError(f"inference request to model '{model}' has string correlation ID '{corrid}', but the "
                          f"model's CORRID control input '{name}' is {datatype.config_name}")
