"""TritonError and TritonModelException: how a model reports a failure, with Triton's error codes."""
from __future__ import annotations


class TritonError(Exception):
    """An error with a Triton status code: put it in ``InferenceResponse(error=...)`` to fail one request,
    or raise it from ``execute`` to fail the whole batch. Codes match TRITONSERVER_Error_Code."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if code not in CODE_NAMES:
            raise ValueError(f"TritonError code must be one of TritonError.{', TritonError.'.join(CODE_NAMES.values())}"
                             f" (0-7), got {code!r}")
        super().__init__(message)
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def code_name(self) -> str:
        """The code's name ("INVALID_ARG"), which is also the server's status name."""
        return CODE_NAMES[self._code]

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._message!r}, {self.code_name()})"


CODE_NAMES: dict[int, str] = {
    TritonError.UNKNOWN: "UNKNOWN",
    TritonError.INTERNAL: "INTERNAL",
    TritonError.NOT_FOUND: "NOT_FOUND",
    TritonError.INVALID_ARG: "INVALID_ARG",
    TritonError.UNAVAILABLE: "UNAVAILABLE",
    TritonError.UNSUPPORTED: "UNSUPPORTED",
    TritonError.ALREADY_EXISTS: "ALREADY_EXISTS",
    TritonError.CANCELLED: "CANCELLED",
}


class TritonModelException(TritonError):
    """Raised by the model API when it is misused; models may raise it to fail a batch."""


def unsupported(feature: str) -> TritonModelException:
    """The error every not-yet-implemented part of the API raises."""
    return TritonModelException(f"{feature} is not supported by triton-serve's python backend yet",
                                TritonError.UNSUPPORTED)
