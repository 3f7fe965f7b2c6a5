"""Server errors carrying Triton's status codes, and how each code maps to HTTP."""
from __future__ import annotations

import enum


class Status(enum.Enum):
    """Triton's error codes (TRITONSERVER_Error_Code)."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"

    @property
    def http_status(self) -> int:
        """The HTTP status this status answers with."""
        return _HTTP_STATUS[self]


_HTTP_STATUS = {
    Status.UNKNOWN: 400,
    Status.INTERNAL: 500,
    Status.NOT_FOUND: 404,
    Status.INVALID_ARG: 400,
    Status.UNAVAILABLE: 503,
    Status.UNSUPPORTED: 501,
    Status.ALREADY_EXISTS: 400,
    Status.CANCELLED: 400,
}


class ServerError(Exception):
    """An error that reaches the client as a Triton status and a message.

    The status defaults to INVALID_ARG (HTTP 400), as Triton answers a request or a config it cannot
    accept: that is what most raises report. A fault of the server, a backend or its framework while
    serving a valid request says INTERNAL (HTTP 500), or any other status that fits, explicitly.
    """

    def __init__(self, message: str, status: Status = Status.INVALID_ARG) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __repr__(self) -> str:
        return f"ServerError({self.status.name}, {self.message!r})"


def not_found(message: str) -> ServerError:
    return ServerError(message, Status.NOT_FOUND)


def unavailable(message: str) -> ServerError:
    return ServerError(message, Status.UNAVAILABLE)


def unsupported(message: str) -> ServerError:
    return ServerError(message, Status.UNSUPPORTED)


def internal(message: str) -> ServerError:
    return ServerError(message, Status.INTERNAL)


def unexpected(error: Exception) -> ServerError:
    """The INTERNAL error that answers for an exception no code meant to raise (a bug in a backend, a
    scheduler or the server), naming its type. Whoever catches such an exception logs it, once, with
    its traceback."""
    return internal(f"{type(error).__name__}: {error}")
