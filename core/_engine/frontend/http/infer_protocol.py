"""``POST .../infer`` straight from the HTTP parser: uvicorn's httptools protocol, with inference requests taken
before they become ASGI messages.

A request that ``InferExchange`` can answer on its own (no trace armed, no raw-binary body, no
``Expect: 100-continue``, within ``--http-max-input-size``, allowed by ``--http-restricted-api``) is parsed when
its body is complete, submitted to the data plane with a sink, and answered from that sink in one write: no
task, no future, no ASGI scope or messages. Every other request, ``/infer`` ones included, goes to the ASGI
app as before. A client that disconnects cancels its request at once.

A request framed both ways, ``Transfer-Encoding: chunked`` and a ``Content-Length`` (what ``requests`` sends for a
body it was handed already chunked), is read by its chunks and answered, as Triton answers it, and its
connection is then closed (RFC 9112 section 6.3), so no bytes after it can be taken for another request.

Copies of an output between the model's response and the socket: one (``encode_response`` joins the JSON
header and the binary blobs), plus one when the head and body are joined for the single write.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import httptools

from ..busy_poll import BusyPoll
from ...errors import ServerError, Status, unexpected
from ...inference import InferenceRequest, InferenceResponse
from ..restricted import RestrictionCheck, http_category
from .app import DECOUPLED_ERROR, HEADER_LENGTH, INFER_PATH, HttpFrontend, error_body
from .app import log as log_requests
from .headers import header_dict

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

_REASONS = {200: b"OK", 400: b"Bad Request", 403: b"Forbidden", 404: b"Not Found", 409: b"Conflict",
            500: b"Internal Server Error", 501: b"Not Implemented", 503: b"Service Unavailable"}


def http_protocol(frontend: HttpFrontend | None, check: RestrictionCheck | None = None,
                  busy_poll: BusyPoll | None = None) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, writing each response in one system call, and answering ``/infer``
    itself when ``frontend`` is given (see the module docstring) and ``check`` (the one that guards the ASGI app)
    lets the request through; each of those requests and answers is told to ``busy_poll``."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    check = check if check is not None and check.restricts else None

    class FastInferProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.parser.set_dangerous_leniencies(lenient_chunked_length=True)  # see the module docstring

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(CoalescingTransport(transport))  # type: ignore[arg-type]

        def on_headers_complete(self) -> None:
            exchange = None
            if frontend is not None and (self.cycle is None or self.cycle.response_complete):
                exchange = InferExchange.take(self, frontend, check, busy_poll)
            if exchange is None:
                previous = self.cycle
                super().on_headers_complete()
                if self.cycle is not previous and _framed_twice(self.headers):
                    self.cycle.keep_alive = False
                return
            if busy_poll is not None:
                busy_poll.arrived()
            self.cycle = exchange  # type: ignore[assignment]  # uvicorn reads response_complete, keep_alive...

        def on_body(self, body: bytes) -> None:
            if type(self.cycle) is InferExchange:
                self.cycle.add_body(body)
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if type(self.cycle) is InferExchange:
                self.cycle.start()
            else:
                super().on_message_complete()

        def shutdown(self) -> None:
            """A graceful stop: an exchange still waiting for its answer closes the connection once answered,
            and becomes a task of uvicorn's, which cancels it when the stop's time is up."""
            exchange = self.cycle
            if type(exchange) is not InferExchange or exchange.response_complete:
                super().shutdown()
                return
            exchange.keep_alive = False
            task = self.loop.create_task(exchange.until_answered())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    return FastInferProtocol


def _framed_twice(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request has both a Transfer-Encoding and a Content-Length header (names are lower case)."""
    names = {name for name, _ in headers}
    return b"transfer-encoding" in names and b"content-length" in names


class InferExchange:
    """One ``/infer`` request and its answer on one connection; stands where uvicorn keeps its
    RequestResponseCycle, so uvicorn's keep-alive, shutdown and pipelining logic see it."""

    __slots__ = ("protocol", "frontend", "busy_poll", "name", "version", "headers", "chunks", "size", "keep_alive",
                 "response_complete", "disconnected", "request", "answered", "inflated", "waiter")

    def __init__(self, protocol: HttpToolsProtocol, frontend: HttpFrontend, busy_poll: BusyPoll | None, name: str,
                 version: int | None, headers: dict[str, str], keep_alive: bool) -> None:
        self.protocol = protocol
        self.frontend = frontend
        self.busy_poll = busy_poll
        self.name = name
        self.version = version
        self.headers = headers
        self.chunks: list[bytes] = []
        self.size = 0
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.request: InferenceRequest | None = None
        self.answered = False
        self.inflated = 0  # bytes the body holds inflated, given back to the front-end once answered
        self.waiter: asyncio.Future[None] | None = None  # set by until_answered, during a graceful stop

    @property
    def message_event(self) -> InferExchange:
        """uvicorn's connection_lost calls ``cycle.message_event.set()``: that is ``set`` here (a property, not an
        attribute, so that an exchange does not refer to itself and is freed as soon as it is done)."""
        return self

    @classmethod
    def take(cls, protocol: HttpToolsProtocol, frontend: HttpFrontend, check: RestrictionCheck | None,
             busy_poll: BusyPoll | None) -> InferExchange | None:
        """An exchange for the request whose headers were just parsed, or None to leave it to the ASGI app."""
        parser = protocol.parser
        if parser.get_method() != b"POST" or not protocol.url.endswith(b"/infer") or protocol.expect_100_continue:
            return None
        if frontend.dataplane.trace_armed:
            return None
        url = protocol.url
        path = url if url[:1] == b"/" and b"?" not in url and b"#" not in url else httptools.parse_url(url).path
        text = path.decode("latin-1")
        match = INFER_PATH.fullmatch(text) if b"%" not in path else None
        if match is None:
            return None
        if check is not None and check.refusal(http_category(text), protocol.headers) is not None:
            return None  # the ASGI app refuses it with Triton's message
        headers = header_dict(protocol.headers)
        length = headers.get(HEADER_LENGTH)
        if length is not None and length.strip() == "0":
            return None  # raw binary: the model's config decides the shape (the ASGI app asks for it)
        declared = headers.get("content-length")
        chunked = "transfer-encoding" in headers  # the parser reads the chunks; the Content-Length does not count
        if declared is not None and not chunked and (not declared.isdigit() or int(declared) > frontend.max_input_size):
            return None
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive() and not (
            chunked and declared is not None)
        return cls(protocol, frontend, busy_poll, match[1], int(match[2]) if match[2] else None, headers, keep_alive)

    def add_body(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size <= self.frontend.max_input_size:
            self.chunks.append(chunk)

    def start(self) -> None:
        """The body is complete: parse it and submit the request, or answer its error."""
        frontend = self.frontend
        if log_requests.isEnabledFor(logging.DEBUG):
            log_requests.debug("HTTP request: %s %s", "POST", self.protocol.url.decode("latin-1"))
        try:
            if self.size > frontend.max_input_size:
                raise frontend.too_large(self.size)
            body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
            self.chunks = []
            body, self.inflated = frontend.decoded_body(body, self.headers.get("content-encoding", ""))
            request = frontend.prepare_infer(self.headers, body, self.name, self.version)
            request.set_sink(self.on_response)
            self.request = request
            frontend.dataplane.submit(request, decoupled_error=DECOUPLED_ERROR)
        except Exception as error:
            self.fail(error)

    def on_response(self, response: InferenceResponse | None, final: bool) -> None:
        """The request's sink: the first response is the answer; a final flag with none is an error."""
        if self.answered:
            return
        request = self.request
        assert request is not None
        try:
            if response is None:
                if final:
                    raise ServerError(f"model '{request.model_name}' sent no response", Status.INTERNAL)
                return
            if response.error is not None:
                raise response.error
            payload, headers = self.frontend.encode_infer(response, request, self.headers)
        except Exception as error:
            self.fail(error)
            return
        self.answer(200, headers, payload)

    async def until_answered(self) -> None:
        """Wait for the answer; cancelled (the graceful stop's time is up), answer that the server is stopping,
        cancel the request and close the connection."""
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        except asyncio.CancelledError:
            if self.request is not None and not self.request.finished:
                self.request.cancel()
            self.fail(ServerError("the server stopped before the request was answered", Status.UNAVAILABLE))
            raise

    def fail(self, error: Exception) -> None:
        if not isinstance(error, ServerError):
            log.error("unexpected error while answering an inference request", exc_info=error)
            error = unexpected(error)
        self.answer(error.status.http_status, [(b"content-type", b"application/json")], error_body(error.message))

    def answer(self, status: int, headers: list[tuple[bytes, bytes]], payload: bytes) -> None:
        if self.answered:
            return
        self.answered = True
        self.response_complete = True
        if self.inflated:
            self.give_back_body()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
        protocol = self.protocol
        if self.disconnected:
            return
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
        for name, value in headers:
            head.append(b"%s: %s\r\n" % (name, value))
        head.append(b"content-length: %d\r\n" % len(payload))
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        head.append(payload)
        protocol.transport.write_now(b"".join(head))  # type: ignore[attr-defined]
        if not self.keep_alive:
            protocol.transport.close()
        elif self.busy_poll is not None:
            self.busy_poll.answered()
        protocol.on_response_complete()

    def give_back_body(self) -> None:
        """The request is answered or its client left: the bytes its body held inflated are free."""
        if self.inflated:
            self.frontend.inflate_budget.give_back(self.inflated)
            self.inflated = 0

    def set(self) -> None:
        """uvicorn calls this when the connection is lost: a request still running is cancelled."""
        if not self.response_complete:
            self.disconnected = True
            self.answered = True
            self.give_back_body()
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)
            if self.request is not None and not self.request.finished:
                self.request.cancel()


class CoalescingTransport:
    """Wraps a transport: what is written during one event-loop turn leaves in one write at its end (uvicorn
    writes a response's head and body separately)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def write_now(self, data: bytes) -> None:
        """Write ``data`` at once, after whatever is pending."""
        if self._pending:
            self._pending.append(data)
            self._flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:  # asked after every response: spared __getattr__'s lookup
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
