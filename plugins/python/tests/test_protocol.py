"""The server <-> worker wire without a worker: every field of EXECUTE and RESULT survives its frame, however split."""
from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Callable
import time

import numpy as np
import pytest

from triton_serve.plugin import (InferenceRequest, RequestContent, RequestedOutput, ResponseContent, ServerError, Status,
                                 Tensor, TensorLayout, decode_content, encode_content, read_tensor)
from triton_serve.testing import assert_same_tensor, wire_samples
from triton_serve_python.arena import ALIGNMENT
from triton_serve_python.inline import pack, unpack
from triton_serve_python.protocol import BlockingChannel, CallFailed, FrameDecoder, Kind, encode
from triton_serve_python.server_calls import WorkerCalls
from triton_serve_python.transfer import describe_requests, read_responses

WORDS = np.array([b"ab", "\u00e9".encode(), b"", b"7"], dtype=object).reshape(2, 2)


def _decode_one(frame: bytes) -> tuple[Kind, object]:
    messages = FrameDecoder().feed(frame)
    assert len(messages) == 1
    return messages[0]


def _requests() -> list[InferenceRequest]:
    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = InferenceRequest("m", 1, id="req-1", inputs={
        "X": Tensor("X", "FP32", (2, 3), floats), "WORDS": Tensor("WORDS", "BYTES", (2, 2), WORDS)},
        outputs=[RequestedOutput("Y"), RequestedOutput("Z")],
        parameters={"flag": True, "count": -3, "ratio": 0.5, "name": "x", "priority": 2})
    first.sequence_id, first.sequence_start, first.sequence_end, first.timeout_us = 2**64 - 1, True, True, 1500
    second = InferenceRequest("m", 1, inputs={"X": Tensor("X", "FP32", (0, 3), np.zeros((0, 3), np.float32))})
    second.sequence_id = "sequence-\u00e9"
    return [first, second]


def test_execute_round_trip_keeps_every_field() -> None:
    layout = TensorLayout()
    described = describe_requests(_requests(), layout)
    arena = memoryview(bytearray(layout.size))
    layout.write(arena)
    kind, (input_arena, decoded) = _decode_one(encode(Kind.EXECUTE, ("arena_7", described)))
    assert (kind, input_arena) == (Kind.EXECUTE, "arena_7")
    assert decoded == described
    (meta, correlation_id, flags, timeout), second = decoded
    assert (correlation_id, flags, timeout) == (2**64 - 1, 3, 1500)
    assert second[1:] == ("sequence-\u00e9", 0, 0)
    first, empty = (decode_content(RequestContent, item[0], arena) for item in decoded)
    assert (first.model_name, first.model_version, first.id) == ("m", 1, "req-1")
    assert [output.name for output in first.outputs] == ["Y", "Z"] and empty.outputs == ()
    assert first.parameters == {"flag": True, "count": -3, "ratio": 0.5, "name": "x"}  # "priority" is a request field
    assert type(first.parameters["flag"]) is bool and type(first.parameters["ratio"]) is float
    assert empty.id == "" and empty.parameters == {}
    assert [(t.name, t.datatype, t.shape) for t in first.inputs] == [("X", "FP32", (2, 3)), ("WORDS", "BYTES", (2, 2))]
    assert first.inputs[0].data.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert first.inputs[1].data.tolist() == WORDS.tolist()
    assert empty.inputs[0].data.shape == (0, 3)


def test_result_round_trip_keeps_outputs_parameters_and_errors() -> None:
    layout = TensorLayout()
    outputs = (Tensor("OUT", "INT32", (1, 2), np.array([[1, -2]], np.int32)), Tensor("WORDS", "BYTES", (2, 2), WORDS))
    results = [encode_content(content, layout) for content in (
        ResponseContent(outputs, {"rows": 1, "done": True, "tag": "t"}), ResponseContent(),
        ResponseContent(error=ServerError("X holds a negative value", Status.INVALID_ARG)))]
    arena = memoryview(bytearray(layout.size))
    layout.write(arena)
    kind, (batch_error, decoded) = _decode_one(encode(Kind.RESULT, (None, results)))
    assert (kind, batch_error) == (Kind.RESULT, None) and decoded == results
    full, empty, failed = read_responses(decoded, arena, copy=True)
    assert [(tensor.name, tensor.datatype, tensor.shape) for tensor in full.outputs] == \
        [("OUT", "INT32", (1, 2)), ("WORDS", "BYTES", (2, 2))]
    assert full.outputs[0].data.tolist() == [[1, -2]] and full.outputs[1].data.tolist() == WORDS.tolist()
    assert full.parameters == {"rows": 1, "done": True, "tag": "t"} and full.error is None
    assert (empty.outputs, empty.parameters, empty.error) == ([], {}, None)
    assert failed.error is not None and (failed.error.message, failed.error.status) == \
        ("X holds a negative value", Status.INVALID_ARG)


def test_batch_errors_and_control_messages_round_trip() -> None:
    batch_error = ("execute raised ValueError: no", "INTERNAL", "Traceback (most recent call last):\n...")
    for kind, body in [(Kind.RESULT, (batch_error, None)), (Kind.INIT, {"model_file": "/m/1/model.py", "args": {}}),
                       (Kind.FAILED, ("boom", "trace")), (Kind.GROW, 1 << 40), (Kind.GROWN, (None, "no space")),
                       (Kind.LOG, ("INFO", "line")), (Kind.STARTED, None), (Kind.FINALIZE, None)]:
        assert _decode_one(encode(kind, body)) == (kind, body)


def test_encode_refuses_what_marshal_cannot_write() -> None:
    with pytest.raises(ValueError):
        encode(Kind.LOG, ("INFO", object()))


def test_frames_survive_any_split() -> None:
    messages = [(Kind.EXECUTE, (None, [("r", 7, 0, 0, [], {}, [("X", "FP32", (1,), 0, 4)])])),
                (Kind.LOG, ("WARNING", "w")), (Kind.FINALIZE, None)]
    stream = b"".join(encode(kind, body) for kind, body in messages)
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == messages
    decoder = FrameDecoder()
    assert [message for index in range(len(stream)) for message in decoder.feed(stream[index:index + 1])] == messages


def test_blocking_channel_reads_a_frame_split_across_sends() -> None:
    server_end, worker_end = socket.socketpair()
    channel = BlockingChannel(worker_end)
    channel.send(encode(Kind.READY))
    assert FrameDecoder().feed(server_end.recv(64)) == [(Kind.READY, None)]
    frame = encode(Kind.GROWN, ("arena_8", None))

    def send_in_pieces() -> None:
        for piece in (frame[:3], frame[3:7], frame[7:]):
            server_end.sendall(piece)
            time.sleep(0.05)
        server_end.close()

    sender = threading.Thread(target=send_in_pieces)
    sender.start()
    try:
        assert channel.receive() == (Kind.GROWN, ("arena_8", None))
        assert channel.receive() is None  # the server closed its end
    finally:
        sender.join()
        worker_end.close()


class _RecordingSocket:
    """A socket end whose ``recv`` calls are recorded with their flags; ``before_sleeping`` runs before the first
    call that may sleep (no MSG_DONTWAIT)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.flags: list[int] = []
        self.before_sleeping: Callable[[], None] | None = None

    def recv(self, size: int, flags: int = 0) -> bytes:
        self.flags.append(flags)
        if not flags & socket.MSG_DONTWAIT and self.before_sleeping is not None:
            self.before_sleeping()
            self.before_sleeping = None
        return self._sock.recv(size, flags)


def test_a_read_after_a_busy_poll_hint_polls_then_sleeps_and_the_hint_is_used_once() -> None:
    server_end, worker_end = socket.socketpair()
    recorder = _RecordingSocket(worker_end)
    channel = BlockingChannel(recorder)  # type: ignore[arg-type]
    try:
        channel.poll_next_s = 0.001  # nothing comes within it: polled without sleeping, then waited for
        recorder.before_sleeping = lambda: server_end.sendall(encode(Kind.FINALIZE))
        assert channel.receive() == (Kind.FINALIZE, None)
        assert recorder.flags[0] == socket.MSG_DONTWAIT and recorder.flags[-1] == 0
        assert channel.poll_next_s == 0.0
        recorder.flags.clear()
        server_end.sendall(encode(Kind.IS_READY))
        assert channel.receive() == (Kind.IS_READY, None)
        assert recorder.flags == [0]  # no hint: one plain read
        channel.poll_next_s = 5.0  # the frame is there already: the first poll returns it
        server_end.sendall(encode(Kind.FINALIZE))
        recorder.flags.clear()
        assert channel.receive() == (Kind.FINALIZE, None)
        assert recorder.flags == [socket.MSG_DONTWAIT]
    finally:
        server_end.close()
        worker_end.close()


def test_hinted_reads_stop_polling_while_batches_come_later_than_the_poll_and_start_again_when_they_come_sooner(
) -> None:
    """Where the next batch keeps coming after the poll's time (a server busy with other work), polling would only
    take a CPU from it: hinted reads then sleep at once, until batches come within the poll's time again."""
    server_end, worker_end = socket.socketpair()
    recorder = _RecordingSocket(worker_end)
    channel = BlockingChannel(recorder)  # type: ignore[arg-type]

    def send_late() -> None:
        time.sleep(0.02)  # far past the 1 ms poll
        server_end.sendall(encode(Kind.IS_READY))

    try:
        late = 0
        for late in range(1, 21):  # batches that come 20 ms after the worker answered
            recorder.flags.clear()
            channel.poll_next_s = 0.001
            recorder.before_sleeping = send_late
            assert channel.receive() == (Kind.IS_READY, None)
            if recorder.flags == [0]:  # straight to sleep, no poll
                break
            assert recorder.flags[0] == socket.MSG_DONTWAIT  # polled, then slept
        assert 2 < late < 20, "one late batch stopped polling, or many never did"
        for sooner in range(1, 41):  # batches waiting when asked for: the average wait falls below 1 ms
            recorder.flags.clear()
            server_end.sendall(encode(Kind.IS_READY))
            channel.poll_next_s = 0.001
            assert channel.receive() == (Kind.IS_READY, None)
            if recorder.flags == [socket.MSG_DONTWAIT]:
                break
        assert 1 < sooner < 40, "polling never came back"
    finally:
        server_end.close()
        worker_end.close()


def _refuse(what: str) -> None:
    raise ServerError(f"no {what} here", Status.NOT_FOUND)


def test_calls_from_any_thread_get_their_own_answers_while_the_loop_receives() -> None:
    server_end, worker_end = socket.socketpair()
    for end in (server_end, worker_end):
        end.settimeout(60)  # a broken channel fails the test instead of hanging it
    channel = BlockingChannel(worker_end)
    calls = WorkerCalls("worker", {"add": lambda a, b: a + b, "refuse": _refuse}, server_end.sendall)
    threads, per_thread = 4, 25

    def answer() -> None:
        """The server: answer each CALL, follow each answer with a message for the serving loop, then FINALIZE."""
        decoder, sequence = FrameDecoder(), 0
        while sequence < threads * (per_thread + 1):
            for kind, body in decoder.feed(server_end.recv(65536)):
                assert kind == Kind.CALL
                calls.on_call(*body)
                server_end.sendall(encode(Kind.GROWN, (str(sequence), None)))
                sequence += 1
        server_end.sendall(encode(Kind.FINALIZE))

    answers: dict[int, list[object]] = {}

    def caller(index: int) -> None:
        answers[index] = [channel.call("add", index, step) for step in range(per_thread)]
        try:
            channel.call("refuse", "entry")
        except CallFailed as failure:
            answers[index].append((failure.message, failure.code_name))

    server = threading.Thread(target=answer)
    callers = [threading.Thread(target=caller, args=(index,)) for index in range(threads)]
    for thread in [server, *callers]:
        thread.start()
    received = []
    while (message := channel.receive()) != (Kind.FINALIZE, None):
        received.append(message)
    for thread in [server, *callers]:
        thread.join()
    worker_end.close()
    server_end.close()
    assert received == [(Kind.GROWN, (str(sequence), None)) for sequence in range(threads * (per_thread + 1))]
    assert answers == {index: [index + step for step in range(per_thread)] + [("no entry here", "NOT_FOUND")]
                       for index in range(threads)}


def test_a_call_the_server_closes_on_raises() -> None:
    server_end, worker_end = socket.socketpair()
    channel = BlockingChannel(worker_end)
    server_end.shutdown(socket.SHUT_WR)  # it takes the call but will never answer
    with pytest.raises(ConnectionError, match="the server closed the connection"):
        channel.call("add", 1, 2)
    assert channel.receive() is None
    worker_end.close()
    server_end.close()


async def _count(n: int) -> AsyncIterator[int]:
    for i in range(n):
        await asyncio.sleep(0)
        yield i


async def _slow_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


async def _fail_midway() -> AsyncIterator[int]:
    yield 1
    raise ServerError("stopped midway", Status.UNAVAILABLE)


def test_awaited_and_streaming_calls_answer_from_the_event_loop() -> None:
    server_end, worker_end = socket.socketpair()
    worker_end.settimeout(60)
    channel = BlockingChannel(worker_end)
    results: dict[str, object] = {}

    def worker() -> None:
        results["stream"] = list(channel.call_stream("count", 3))
        results["add"] = channel.call("slow_add", 2, 3)
        received: list[object] = []
        try:
            received.extend(channel.call_stream("fail_midway"))
        except CallFailed as failure:
            received.append((failure.message, failure.code_name))
        results["fail"] = received
        worker_end.shutdown(socket.SHUT_WR)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server_end.setblocking(False)
        calls = WorkerCalls("worker", {"count": _count, "slow_add": _slow_add, "fail_midway": _fail_midway},
                            server_end.sendall)
        decoder = FrameDecoder()
        while data := await asyncio.wait_for(loop.sock_recv(server_end, 65536), 60):
            for kind, body in decoder.feed(data):
                assert kind == Kind.CALL
                calls.on_call(*body)

    thread = threading.Thread(target=worker)
    thread.start()
    asyncio.run(serve())
    thread.join()
    worker_end.close()
    server_end.close()
    assert results == {"stream": [0, 1, 2], "add": 5, "fail": [1, ("stopped midway", "UNAVAILABLE")]}


def test_every_datatype_crosses_the_worker_boundary_unchanged() -> None:
    """The core's wire form through each way a tensor reaches or leaves a worker: an EXECUTE's inputs in the arena,
    a RESULT's outputs read back from it, and tensors inside frames (response senders, BLS)."""
    samples = wire_samples()
    request = InferenceRequest("m", 1, inputs={name: Tensor(name, datatype, array.shape, array)
                                               for name, datatype, array in samples})
    layout = TensorLayout(ALIGNMENT)
    [described] = describe_requests([request], layout)
    arena = memoryview(bytearray(layout.size))
    layout.write(arena)
    _, (_, [decoded]) = _decode_one(encode(Kind.EXECUTE, (None, [described])))
    refs = [ref for ref, _parameters in decoded[0][4]]  # RequestContent's inputs
    for ref, (name, datatype, array) in zip(refs, samples):
        assert ref[:3] == (name, datatype, array.shape) and ref[3] % ALIGNMENT == 0
        assert_same_tensor(read_tensor(arena, ref), array, datatype)
    _, (_, results) = _decode_one(encode(Kind.RESULT, (None, [(tuple((ref, None) for ref in refs), {}, None)])))
    [response] = read_responses(results, arena, copy=True)
    assert response is not None
    for tensor, (name, datatype, array) in zip(response.outputs, samples):
        assert_same_tensor(tensor.data, array, datatype)
    inline = pack(ResponseContent(tuple(Tensor(name, datatype, array.shape, array) for name, datatype, array in samples)))
    _, packed = _decode_one(encode(Kind.RESPONSE, (1, inline, True)))
    for tensor, (name, datatype, array) in zip(unpack(ResponseContent, packed[1], writable=True).outputs, samples):
        assert_same_tensor(tensor.data, array, datatype)
