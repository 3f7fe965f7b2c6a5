"""Running a bound function in a worker process of its own (``Triton.bind(..., process_isolation=True)``).

The worker is a fresh interpreter (``python -m triton_serve_pytriton.isolation``), so the script that
called ``bind`` is not run again in it. It reads the pickled function, the model's configuration and the server's
content types, then answers each call with the function's results, one message per result (a generator's, one
per value). Requests and responses cross as their content in the core's codec (``encode_content``: metadata, and
one buffer of their tensors' bytes, writable in the worker as the function's inputs are): the worker checks each
result as PyTriton does (``results.to_responses``) and sends the responses it makes. Messages are length-prefixed
pickles of that metadata on the worker's stdin and on a copy of its stdout; what the function prints goes to
stderr.
"""
from __future__ import annotations

import importlib
import io
import os
import pickle
import struct
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import wrapt

from triton_serve.worker import (RequestContent, ResponseContent, ServerError, Status, TensorLayout, content_type_named,
                                 decode_content, encode_content)

from .model_config import TritonModelConfig

_HEADER = struct.Struct("<Q")
# Every wrapt proxy (decorated functions) derives from this: BaseObjectProxy from wrapt 2, ObjectProxy before.
_PROXY: type = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)


class _ByReference(pickle.Pickler):
    """Pickles decorated functions (wrapt proxies, which refuse pickling) as their import path."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _PROXY):
            module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
            if module and name and "<locals>" not in name and module != "__main__":
                return _import, (module, name)
            raise pickle.PicklingError(f"{obj!r} is decorated and not importable by name")
        return NotImplemented


def _import(module: str, name: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def pickle_function(function: Callable[..., Any]) -> bytes:
    """``function`` as the worker will load it; raises ValueError saying why it cannot be sent."""
    module = getattr(function, "__module__", None) or getattr(getattr(function, "__class__", None), "__module__", "")
    if module == "__main__":
        raise ValueError(f"{function!r} is defined in the main script, which a worker process does not import; "
                         "define it in an importable module")
    buffer = io.BytesIO()
    try:
        _ByReference(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(function)
    except Exception as error:  # PicklingError, TypeError, AttributeError: whatever pickle says
        raise ValueError(f"{function!r} cannot be pickled: {error}") from None
    return buffer.getvalue()


def _send(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the worker process ended")
    (size,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(size))


class WorkerProcess:
    """One worker process serving one function; ``call`` runs on one thread at a time."""

    def __init__(self, pickled: bytes, name: str, content_types: dict[str, str], config: TritonModelConfig,
                 strict: bool) -> None:
        self.name = name
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
        self.process = subprocess.Popen([sys.executable, "-m", "triton_serve_pytriton.isolation"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment)
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in, self._out = self.process.stdin, self.process.stdout
        try:
            _send(self._in, (pickled, content_types, config, strict))
            self.response_type = content_type_named(content_types["response"], ResponseContent)
            reply = _receive(self._out)
        except (OSError, EOFError) as error:
            self.close()
            raise ServerError(f"the worker process of '{name}' did not start: {error}", Status.INTERNAL) from None
        if reply[0] != "ready":
            self.close()
            raise ServerError(f"the worker process of '{name}' could not load its function: {reply[2]}",
                              Status.INTERNAL)

    def call(self, requests: Sequence[RequestContent], default_outputs: Sequence[str],
             partial: bool) -> Iterator[list[ResponseContent]]:
        """Send ``requests`` (``default_outputs``: the outputs of one that asks for none); yield the responses of
        each result the function returns or yields, checked in the worker (``partial``: a decoupled model's)."""
        layout = TensorLayout()
        metas = [encode_content(content, layout) for content in requests]
        try:
            _send(self._in, ("call", metas, layout.tobytes(), list(default_outputs), partial))
            while True:
                kind, *payload = _receive(self._out)
                if kind == "done":
                    return
                if kind == "refused":  # the results as a whole were wrong: PyTriton's message
                    raise ServerError(payload[0], Status[payload[1]])
                if kind == "error":
                    raise ServerError(f"{payload[0]}: {payload[1]}", Status.INTERNAL)
                responses, buffer = payload
                yield [decode_content(self.response_type, meta, buffer) for meta in responses]
        except (OSError, EOFError) as error:
            raise ServerError(f"the worker process of '{self.name}' failed: {error}", Status.UNAVAILABLE) from None

    def close(self) -> None:
        """Ask the worker to end; kill it if it does not within 10 s."""
        try:
            _send(self._in, ("close",))
            self._in.close()
        except OSError:
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._out.close()


def _serve(commands: IO[bytes], replies: IO[bytes]) -> None:
    from .calling import requests_of, results_of  # here, not at import: keeps the parent's import light
    from .results import to_responses
    try:
        pickled, content_types, config, strict = _receive(commands)
        function = pickle.loads(pickled)
        request_type = content_type_named(content_types["request"], RequestContent)
        response_type = content_type_named(content_types["response"], ResponseContent)
    except Exception as error:
        _send(replies, ("error", type(error).__name__, str(error)))
        return
    _send(replies, ("ready",))
    while True:
        try:
            command = _receive(commands)
        except EOFError:
            return
        if command[0] == "close":
            return
        try:
            _, metas, buffer, default_outputs, partial = command
            contents = [decode_content(request_type, meta, buffer) for meta in metas]
            for result in results_of(function, requests_of(contents, default_outputs)):
                layout = TensorLayout()
                responses = to_responses(config, strict, contents, result, partial, response_type)
                _send(replies, ("result", [encode_content(response, layout) for response in responses],
                                layout.tobytes()))
        except ServerError as error:
            _send(replies, ("refused", error.message, error.status.name))
        except Exception as error:
            traceback.print_exc()
            _send(replies, ("error", type(error).__name__, str(error)))
        else:
            _send(replies, ("done",))


def main() -> None:
    """The worker process: its protocol takes stdin and a copy of stdout; stdout then goes to stderr."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
