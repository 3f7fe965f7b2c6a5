"""OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""
from __future__ import annotations

import json
from typing import Any

from triton_serve.frontend import ServerError, Status

# OpenAI's error type for each status this front-end answers with.
_TYPES = {400: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 500: "internal_error",
          501: "invalid_request_error", 503: "service_unavailable"}


class OpenAIError(Exception):
    """A request this front-end answers with an OpenAI error body (``param``: the request field at fault)."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def encoded(self) -> bytes:
        return json.dumps(self.body()).encode()

    @classmethod
    def from_server(cls, error: ServerError) -> OpenAIError:
        """A triton-serve error (a model's, the data plane's) with its status."""
        code = "model_not_found" if error.status is Status.NOT_FOUND else None
        return cls(error.message, error.status.http_status, code=code)


def bad_field(name: str, message: str) -> OpenAIError:
    """400 for a request field that is missing, of the wrong type or out of range."""
    return OpenAIError(message, 400, param=name, code="invalid_value")
