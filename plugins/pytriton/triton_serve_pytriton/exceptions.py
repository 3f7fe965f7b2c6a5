"""PyTriton's exceptions, under the same names (``pytriton.exceptions``)."""
from __future__ import annotations


class PyTritonError(Exception):
    """The base of every error this package raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    @property
    def message(self) -> str:
        """The error's message."""
        return self._message


class PyTritonValidationError(PyTritonError):
    """A value given to the API is not valid (a model name, a tensor, a function's result)."""


class PyTritonInvalidOperationError(PyTritonError):
    """The operation cannot be done now (a model bound twice under one name)."""


class PyTritonBadParameterError(PyTritonError):
    """A parameter has a value that cannot be used (a decorator's argument, a batcher setting)."""


class PyTritonModelConfigError(PyTritonError):
    """The model configuration is not valid."""


class PyTritonUnrecoverableError(PyTritonError):
    """Raised by an inference function when the server cannot go on: the request fails and the server stops."""


class PyTritonRuntimeError(PyTritonError):
    """Something went wrong while serving (a decorator met inputs it cannot handle)."""
