"""The worker process, ``python -m triton_serve_python.worker <socket fd>``, that serves one model instance."""
from __future__ import annotations

import faulthandler
import signal
import socket
import sys
import time
import traceback

from triton_serve.worker import (ContentMeta, RequestContent, ResponseContent, TensorLayout, content_type_named,
                                 encode_content)

from .arena import ALIGNMENT, attach, close_mapping, mapped_bytes
from .idle_polling import IdlePriority
from .pb_utils.errors import TritonError, TritonModelException
from .pb_utils.logger import set_log_sink
from .pb_utils.contents import response_content
from .pb_utils.messages import InferenceResponse
from .pb_utils.server_link import ServerLink, set_server_link
from .protocol import BatchError, BlockingChannel, Kind, RequestTuple, encode
from .runner import ExecuteReturnError, ModelRunner, execute_failure


class WorkerArenas:
    """The worker's mappings of its two arenas; they are swapped when the server replaces one."""

    def __init__(self, input_name: str, output_name: str) -> None:
        self.input = attach(input_name)
        self.output = attach(output_name)

    def replace_input(self, name: str) -> None:
        old, self.input = self.input, attach(name)
        close_mapping(old)

    def grow_output(self, channel: BlockingChannel, needed: int) -> None:
        """Ask the server for a larger output arena (it creates the segment, so it can always unlink it)."""
        channel.send(encode(Kind.GROW, needed))
        reply = channel.receive()
        if reply is None:
            raise ConnectionError("the server closed the connection")
        _kind, (name, error) = reply
        if name is None:
            raise TritonError(f"no shared memory for {needed} bytes of outputs: {error}", TritonError.UNAVAILABLE)
        old, self.output = self.output, attach(name)
        close_mapping(old)


def _response_meta(response: InferenceResponse | None, layout: TensorLayout,
                   content_type: type[ResponseContent]) -> ContentMeta | None:
    """The response's content for RESULT (its outputs laid out in ``layout``); None where the request is answered
    through its response sender."""
    return None if response is None else encode_content(response_content(response, content_type), layout)


def _batch_error(error: Exception, model_instance_name: str) -> BatchError:
    """(message, code name, traceback or None): Triton's text for a failed ``execute``, INTERNAL. A raised
    pb_utils.TritonError (which Triton cannot raise: there it is no exception) keeps its message and code."""
    if isinstance(error, TritonError) and not isinstance(error, (TritonModelException, ExecuteReturnError)):
        return error.message(), error.code_name(), None
    trace = None if isinstance(error, ExecuteReturnError) else traceback.format_exc()
    return execute_failure(error, model_instance_name), "INTERNAL", trace


def run_batch(channel: BlockingChannel, runner: ModelRunner, arenas: WorkerArenas, requests: list[RequestTuple],
              keys: list[int], inline: bytes | None) -> bytes:
    """The RESULT frame for one batch; a failure anywhere, encoding included, makes it a batch error. A batch whose
    inputs came inside its frame (``inline``) answers inside the frame too: the server may already have sent the
    next batch, so the arenas are not this batch's to use."""
    try:
        source = memoryview(bytearray(inline)) if inline is not None else mapped_bytes(arenas.input)
        started = time.monotonic_ns()
        responses = runner.execute(requests, source, keys)
        finished = time.monotonic_ns()
        layout = TensorLayout(ALIGNMENT)
        response_type = runner.link.response_type
        results = [_response_meta(response, layout, response_type) for response in responses]
        if inline is not None:
            outputs = bytearray(layout.size)
            layout.write(memoryview(outputs))
            return encode(Kind.RESULT, (None, results, outputs, (started, finished)))
        if layout.size > arenas.output.size:
            arenas.grow_output(channel, layout.size)
        layout.write(mapped_bytes(arenas.output))
        return encode(Kind.RESULT, (None, results, None, (started, finished)))
    except Exception as error:
        return encode(Kind.RESULT, (_batch_error(error, runner.link.model_instance_name), None, None, None))


def serve(channel: BlockingChannel, runner: ModelRunner, arenas: WorkerArenas) -> int:
    while True:
        message = channel.receive()
        if message is None:
            return 0
        kind, body = message
        if kind == Kind.EXECUTE:
            input_arena, requests, keys, inline, poll_s = body
            if input_arena is not None:
                arenas.replace_input(input_arena)
            channel.send(run_batch(channel, runner, arenas, requests, keys, inline))
            channel.poll_next_s = poll_s
        elif kind == Kind.FINALIZE:
            try:
                runner.finalize()
            except Exception:
                channel.send(encode(Kind.LOG, ("ERROR", f"finalize of python model '{runner.model_name}' raised:\n"
                                               + traceback.format_exc())))
            channel.send(encode(Kind.FINALIZED))
            return 0
        elif kind == Kind.IS_READY:
            channel.send(encode(Kind.READINESS, runner.is_ready()))


def main(argv: list[str]) -> int:
    """Say STARTED, receive INIT, load the model and answer READY (or FAILED), then run EXECUTE messages in the
    order they came, one at a time, until FINALIZE or until the server closes the socket."""
    channel = BlockingChannel(socket.socket(fileno=int(argv[1])), IdlePriority.probed())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which then stops its workers
    faulthandler.enable()  # a crash in model code prints its Python traceback to the server's stderr
    set_log_sink(lambda level, line: channel.send(encode(Kind.LOG, (level, line))))
    channel.send(encode(Kind.STARTED))
    message = channel.receive()
    if message is None or message[0] != Kind.INIT:
        return 1
    init = message[1]
    content_types = init["content_types"]
    link = ServerLink(channel, init["args"]["model_instance_name"],
                      content_type_named(content_types["request"], RequestContent),
                      content_type_named(content_types["response"], ResponseContent))
    set_server_link(link)
    try:
        arenas = WorkerArenas(init["input_arena"], init["output_arena"])
        runner = ModelRunner(init["model_file"], init["args"]["model_name"], int(init["args"]["model_version"]),
                             init["outputs"], decoupled=init["decoupled"], link=link)
        runner.initialize(init["args"])
    except Exception as error:
        channel.send(encode(Kind.FAILED, (f"{type(error).__name__}: {error}", traceback.format_exc())))
        return 1
    channel.send(encode(Kind.READY, runner.has_is_ready))
    return serve(channel, runner, arenas)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
