"""The in-process API: a server started, called and stopped from Python, on its own loop thread."""
from __future__ import annotations

import asyncio
import atexit
import queue
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from google.protobuf import json_format

from .datatypes import datatype_of
from .errors import ServerError, Status
from .frontend.frontends import new_event_loop
from .inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from .protos.model_config_pb2 import ModelConfig
from .server import Server as EngineServer
from .server import ServerOptions

T = TypeVar("T")
Outputs = dict[str, np.ndarray]
DECOUPLED_ERROR = "infer() does not serve models with a decoupled transaction policy: use stream()"
# What a sink hands a streaming consumer: a response (or None with the final flag), or an error that
# stopped the request before it started.
_Item = tuple["InferenceResponse | None", bool]


class Server:
    """One triton-serve server in this process: the models of ``model_repository``, served to Python
    callers through ``model(name).infer(...)`` and, when ``start`` is given ports, to HTTP and gRPC
    clients too, through the same inference path (validation, cache, schedulers, statistics).

    ``options`` are ``triton_serve.plugin.ServerOptions`` fields (``model_control_mode``,
    ``backend_config``, ``cache_config``, ``rate_limit``...). Without a repository the server starts
    with none, in explicit model-control mode: ``load(name, config=..., files=...)`` adds models.
    The server runs on an event loop of its own, in a daemon thread; every method here may be called
    from any thread (the sync ones block the caller, never the loop) or, for the ``async_`` ones, from
    any event loop.
    """

    def __init__(self, model_repository: str | Path | Sequence[str | Path] | None = None, **options: Any) -> None:
        if model_repository is None:
            self._empty_repository: tempfile.TemporaryDirectory[str] | None = tempfile.TemporaryDirectory(
                prefix="triton-serve-empty-repository-")
            repositories = [self._empty_repository.name]
            options.setdefault("model_control_mode", "explicit")
        else:
            self._empty_repository = None
            repositories = [str(model_repository)] if isinstance(model_repository, (str, Path)) \
                else [str(path) for path in model_repository]
        unknown = sorted(set(options) - set(ServerOptions.__dataclass_fields__))
        if unknown:
            raise TypeError(f"unknown server option(s): {', '.join(unknown)}")
        self._options = options
        self._repositories = repositories
        self._engine: EngineServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._state = "new"  # new -> starting -> running -> stopped
        self._lock = threading.Lock()

    # ---- life cycle ---------------------------------------------------------------------------

    def start(self, *, http_port: int | None = None, grpc_port: int | None = None,
              metrics_port: int | None = None, timeout: float = 300) -> Server:
        """Load the models the control mode asks for and, for each port given, serve HTTP, gRPC or
        Prometheus metrics on it (0.0.0.0 unless ``http_address`` and the like say otherwise). Returns
        the server once it serves. A server starts once: after ``stop``, make a new one."""
        with self._lock:
            if self._state != "new":
                raise ServerError(f"this server was already started (it is {self._state}); make a new one",
                                  Status.UNAVAILABLE)
            self._state = "starting"
        options = ServerOptions(model_repositories=self._repositories, **self._options)
        options.allow_http, options.allow_grpc = http_port is not None, grpc_port is not None
        options.allow_metrics = metrics_port is not None
        options.http_port, options.grpc_port = http_port or 0, grpc_port or 0
        options.metrics_port = metrics_port or 0
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="triton-serve", daemon=True)
        self._thread.start()
        try:
            self._engine = self._run(self._create(options), timeout)
            self._run(self._engine.start(), timeout)
        except BaseException:
            self._state = "stopped"
            self._close_loop()
            raise
        self._state = "running"
        atexit.register(self.stop)  # a script or notebook that ends without stop() still unloads its models
        return self

    async def async_start(self, *, http_port: int | None = None, grpc_port: int | None = None,
                          metrics_port: int | None = None, timeout: float = 300) -> Server:
        """``start`` for a caller on an event loop (the wait runs in a worker thread)."""
        return await asyncio.to_thread(self.start, http_port=http_port, grpc_port=grpc_port,
                                       metrics_port=metrics_port, timeout=timeout)

    def stop(self, timeout: float = 300) -> None:
        """Stop serving: let requests in flight finish (up to ``exit_timeout_secs``), unload every
        model, close the ports and the loop. Later calls (``infer`` included) raise UNAVAILABLE;
        calling ``stop`` again does nothing."""
        with self._lock:
            if self._state in ("new", "stopped"):
                self._state = "stopped"
                self._cleanup()
                return
            self._state = "stopped"
        atexit.unregister(self.stop)
        try:
            if self._engine is not None:
                self._run(self._engine.stop(), timeout, check=False)
                self._run(_cancel_leftover_tasks(), timeout, check=False)
        finally:
            self._close_loop()
            self._cleanup()

    async def async_stop(self, timeout: float = 300) -> None:
        """``stop`` for a caller on an event loop."""
        await asyncio.to_thread(self.stop, timeout)

    def __enter__(self) -> Server:
        return self.start() if self._state == "new" else self

    def __exit__(self, *_: object) -> None:
        self.stop()

    async def __aenter__(self) -> Server:
        return await self.async_start() if self._state == "new" else self

    async def __aexit__(self, *_: object) -> None:
        await self.async_stop()

    @property
    def is_running(self) -> bool:
        """True between ``start`` returning and ``stop`` being called."""
        return self._state == "running"

    @property
    def options(self) -> ServerOptions:
        """The options the running server was started with (ports included)."""
        return self._running().options

    def http_url(self) -> str:
        """``host:port`` of the HTTP front-end, as tritonclient takes it (loopback for 0.0.0.0)."""
        return self._url(self.options.http_address, self.options.http_port, self.options.allow_http, "HTTP")

    def grpc_url(self) -> str:
        """``host:port`` of the gRPC front-end."""
        return self._url(self.options.grpc_address, self.options.grpc_port, self.options.allow_grpc, "gRPC")

    @staticmethod
    def _url(address: str, port: int, allowed: bool, what: str) -> str:
        if not allowed:
            raise ServerError(f"this server serves no {what} (start it with a port for it)", Status.UNAVAILABLE)
        return f"{'127.0.0.1' if address in ('0.0.0.0', '') else address}:{port}"

    # ---- models -------------------------------------------------------------------------------

    def model(self, name: str, version: int | None = None) -> Model:
        """A handle on model ``name`` (``version``: one version; None: the latest ready one at each call).
        Making it checks nothing: calls on it fail as a request would."""
        return Model(self, name, version)

    def models(self) -> list[dict[str, str]]:
        """The repository index: ``{"name", "version", "state", "reason"}`` of every model, as
        ``POST /v2/repository/index`` answers."""
        return self._call(lambda engine: engine.dataplane.repository_index())

    def ready(self) -> bool:
        """Server readiness, as ``/v2/health/ready`` reports it (False once stopped)."""
        if self._state != "running":
            return False
        return self._call(lambda engine: engine.dataplane.server_ready())

    def load(self, name: str, *, config: ModelConfig | Mapping[str, Any] | str | None = None,
             files: Mapping[str, bytes] | None = None) -> None:
        """Load or reload ``name`` (explicit model-control mode), as ``POST /v2/repository/models/<name>/load``
        does: ``config`` replaces its config (a ModelConfig message, Triton's JSON as a dict or a string),
        ``files`` (``{"1/model.onnx": bytes}``) its version folders, so that a model needs no repository.
        Raises ServerError with the reason when it fails."""
        parameters: dict[str, Any] = {}
        if config is not None:
            if isinstance(config, ModelConfig):
                parameters["config"] = json_format.MessageToJson(config, preserving_proto_field_name=True)
            elif isinstance(config, str):
                parameters["config"] = config
            else:
                parameters["config"] = json_format.MessageToJson(
                    json_format.ParseDict(dict(config), ModelConfig()), preserving_proto_field_name=True)
        for path, content in (files or {}).items():
            parameters[f"file:{path}"] = content
        self._call(lambda engine: engine.dataplane.load_model(name, parameters))

    def unload(self, name: str, *, unload_dependents: bool = False) -> None:
        """Unload ``name`` (explicit model-control mode); with ``unload_dependents``, the models using it."""
        self._call(lambda engine: engine.dataplane.unload_model(name, unload_dependents))

    def statistics(self, name: str = "", version: int | None = None) -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries (every model when ``name`` is empty), as
        ``GET /v2/models/<name>/stats`` answers."""
        return self._call(lambda engine: engine.dataplane.model_statistics(name, version))

    # ---- plumbing -----------------------------------------------------------------------------

    async def _create(self, options: ServerOptions) -> EngineServer:
        return EngineServer(options)

    def _running(self) -> EngineServer:
        if self._state != "running" or self._engine is None:
            what = "was stopped" if self._state == "stopped" else "is not started"
            raise ServerError(f"the server {what}: call start() first" if self._state != "stopped"
                              else f"the server {what}", Status.UNAVAILABLE)
        return self._engine

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None, check: bool = True) -> T:
        loop = self._loop
        if loop is None or loop.is_closed():
            coroutine.close()
            raise ServerError("the server was stopped", Status.UNAVAILABLE)
        if check and _on_loop(loop):
            coroutine.close()
            raise RuntimeError("a blocking call on the server's own event loop: use the async_ methods there")
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)

    def _call(self, method: Callable[[EngineServer], Coroutine[Any, Any, T]]) -> T:
        engine = self._running()
        return self._run(method(engine))

    async def _acall(self, method: Callable[[EngineServer], Coroutine[Any, Any, T]]) -> T:
        engine = self._running()
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(method(engine), self._loop))

    def _submit_soon(self, request: InferenceRequest, decoupled_error: str | None = None) -> Future[None]:
        """Submit ``request`` on the loop; the future fails with the reason it could not start
        (``decoupled_error``: the message for a decoupled model, for callers that expect one response)."""
        engine = self._running()
        assert self._loop is not None
        started: Future[None] = Future()

        def submit() -> None:
            if self._state != "running":
                started.set_exception(ServerError("the server was stopped", Status.UNAVAILABLE))
                return
            try:
                engine.dataplane.submit(request, decoupled_error=decoupled_error)
            except ServerError as error:
                started.set_exception(error)
            else:
                started.set_result(None)

        self._loop.call_soon_threadsafe(submit)
        return started

    def _cancel_soon(self, request: InferenceRequest) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(request.cancel)

    def _close_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(30)
        if not loop.is_running():
            loop.close()

    def _cleanup(self) -> None:
        if self._empty_repository is not None:
            self._empty_repository.cleanup()
            self._empty_repository = None


class Model:
    """One model of an in-process ``Server``: inference and its facts. ``inputs`` map input names to
    arrays (anything ``numpy.asarray`` takes; ``str`` and ``bytes`` arrays become BYTES); the outputs
    come back as a dict of numpy arrays (BYTES as object arrays of ``bytes``). Errors are raised as
    ``ServerError`` with the message and status a wire client would get."""

    def __init__(self, server: Server, name: str, version: int | None = None) -> None:
        self.server = server
        self.name = name
        self.version = version

    def __repr__(self) -> str:
        return f"Model({self.name!r}, version={self.version!r})"

    def _request(self, inputs: Mapping[str, Any], parameters: Mapping[str, Any] | None,
                 requested_outputs: Sequence[str] | None) -> InferenceRequest:
        return InferenceRequest(
            self.name, self.version, inputs={name: _tensor(name, value) for name, value in inputs.items()},
            outputs=[RequestedOutput(name) for name in requested_outputs or ()],
            parameters=dict(parameters or {}))

    def infer(self, inputs: Mapping[str, Any], *, parameters: Mapping[str, Any] | None = None,
              requested_outputs: Sequence[str] | None = None, timeout: float | None = None) -> Outputs:
        """Run one request and return its outputs (all of them, or ``requested_outputs``). A decoupled
        model answers through ``stream``. ``timeout``: seconds to wait for the answer (then TimeoutError,
        and the request is cancelled)."""
        request = self._request(inputs, parameters, requested_outputs)
        answered: Future[InferenceResponse] = Future()
        request.set_sink(lambda response, final: _settle(answered, request, response, final))
        self.server._submit_soon(request, DECOUPLED_ERROR).result(timeout)
        try:
            return _outputs(answered.result(timeout))
        except TimeoutError:
            self.server._cancel_soon(request)
            raise

    async def async_infer(self, inputs: Mapping[str, Any], *, parameters: Mapping[str, Any] | None = None,
                          requested_outputs: Sequence[str] | None = None) -> Outputs:
        """``infer`` for a caller on an event loop; cancelling the awaiting task cancels the request."""
        request = self._request(inputs, parameters, requested_outputs)
        answered: Future[InferenceResponse] = Future()
        request.set_sink(lambda response, final: _settle(answered, request, response, final))
        try:
            await asyncio.wrap_future(self.server._submit_soon(request, DECOUPLED_ERROR))
            return _outputs(await asyncio.wrap_future(answered))
        except asyncio.CancelledError:
            self.server._cancel_soon(request)
            raise

    def stream(self, inputs: Mapping[str, Any], *, parameters: Mapping[str, Any] | None = None,
               requested_outputs: Sequence[str] | None = None, timeout: float | None = None) -> Iterator[Outputs]:
        """Run one request and yield the outputs of each of its responses as they come (a decoupled model
        sends 0..N; another model, one). ``timeout``: the most seconds to wait for each response.
        Leaving the loop early cancels the request."""
        request = self._request(inputs, parameters, requested_outputs)
        received: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        request.set_sink(lambda response, final: received.put((response, final)))
        self.server._submit_soon(request).result(timeout)
        return self._drain(request, lambda: received.get(timeout=timeout))

    def _drain(self, request: InferenceRequest, take: Callable[[], _Item]) -> Iterator[Outputs]:
        finished = False
        try:
            while not finished:
                try:
                    response, finished = take()
                except queue.Empty:
                    raise TimeoutError(f"model '{self.name}' sent no response in time") from None
                if response is not None:
                    yield _outputs(response)
        finally:
            if not finished:
                self.server._cancel_soon(request)

    async def async_stream(self, inputs: Mapping[str, Any], *, parameters: Mapping[str, Any] | None = None,
                           requested_outputs: Sequence[str] | None = None) -> AsyncIterator[Outputs]:
        """``stream`` for a caller on an event loop: ``async for outputs in model.async_stream(...)``."""
        request = self._request(inputs, parameters, requested_outputs)
        loop = asyncio.get_running_loop()
        received: asyncio.Queue[_Item] = asyncio.Queue()

        def deliver(response: InferenceResponse | None, final: bool) -> None:  # on the server's loop
            loop.call_soon_threadsafe(received.put_nowait, (response, final))

        request.set_sink(deliver)
        await asyncio.wrap_future(self.server._submit_soon(request))
        finished = False
        try:
            while not finished:
                response, finished = await received.get()
                if response is not None:
                    yield _outputs(response)
        finally:
            if not finished:
                self.server._cancel_soon(request)

    def ready(self) -> bool:
        """Whether the model (the version, if given) is loaded and ready."""
        return self.server._call(lambda engine: engine.dataplane.model_ready(self.name, self.version))

    def metadata(self) -> dict[str, Any]:
        """The model's metadata, as ``GET /v2/models/<name>`` answers."""
        return self.server._call(lambda engine: engine.dataplane.model_metadata(self.name, self.version))

    def config(self) -> dict[str, Any]:
        """The model's completed config as Triton's JSON, as ``GET /v2/models/<name>/config`` answers."""
        return self.server._call(lambda engine: engine.dataplane.model_config_json(self.name, self.version))

    def statistics(self) -> list[dict[str, Any]]:
        """This model's ``model_stats`` entries."""
        return self.server.statistics(self.name, self.version)


def _tensor(name: str, value: Any) -> Tensor:
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype.kind in "SU" or (array.dtype.kind == "O" and array.size and not isinstance(array.flat[0], bytes)):
        array = np.array([item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in array.flat],
                         dtype=object).reshape(array.shape)
    try:
        datatype = datatype_of(array)
    except ValueError as error:
        raise ServerError(f"input '{name}': {error}") from None
    return Tensor(name, datatype, tuple(array.shape), array)


def _outputs(response: InferenceResponse) -> Outputs:
    if response.error is not None:
        raise response.error
    return {tensor.name: tensor.data for tensor in response.outputs}


def _settle(answered: Future[InferenceResponse], request: InferenceRequest,
            response: InferenceResponse | None, final: bool) -> None:
    """The sink of a one-response request (on the loop): the first response answers it."""
    if answered.done():
        return
    if response is not None:
        answered.set_result(response)
    elif final:
        answered.set_result(InferenceResponse.from_error(
            ServerError(f"model '{request.model_name}' sent no response", Status.INTERNAL)))


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _cancel_leftover_tasks() -> None:
    """Finish the tasks the HTTP library leaves pending at shutdown before the loop closes."""
    current = asyncio.current_task()
    leftover = [task for task in asyncio.all_tasks() if task is not current]
    for task in leftover:
        task.cancel()
    await asyncio.gather(*leftover, return_exceptions=True)
