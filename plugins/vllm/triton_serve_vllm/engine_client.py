"""The server's side of one engine process: starts it, sends it requests, turns its frames into responses, aborts
cancelled requests, and fails what is open when the process goes away (server process, event loop)."""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from triton_serve.plugin import InferenceRequest, InferenceResponse, ServerError, Status, Tensor

from .protocol import EngineInfo, FrameProtocol, MetricUpdate, Outputs, Start

log = logging.getLogger("triton_serve_vllm")

# Every engine client of this process (tests read their counters).
ENGINES: weakref.WeakSet[EngineClient] = weakref.WeakSet()

# How long an engine process may take to exit once its socket closed (vLLM shuts its own processes down first).
EXIT_WAIT_S = 30.0
# How long an engine may take to get ready: vLLM's first start compiles the model (minutes on a busy CPU).
START_WAIT_S = 1200.0


class EngineClient:
    """One engine process. ``start`` returns once the engine runs; ``submit`` hands it a request, whose responses
    come back through ``request.send``; ``stop`` ends it. ``dead`` holds why the process ended unasked."""

    def __init__(self, label: str, env: dict[str, str],
                 on_metrics: Callable[[MetricUpdate], None] | None = None) -> None:
        self.label = label
        self.env = env
        self.on_metrics = on_metrics
        self.info: EngineInfo | None = None
        self.dead: str | None = None
        self.aborted = 0  # requests vLLM reported aborted after a cancellation
        self.unfinished_after_abort: int | None = None  # vLLM's count of unfinished requests after the last abort
        self._requests: dict[int, InferenceRequest] = {}
        self._keys = itertools.count(1)
        self._process: asyncio.subprocess.Process | None = None
        self._protocol: FrameProtocol | None = None
        self._started: asyncio.Future[EngineInfo] | None = None
        self._stopping = False
        ENGINES.add(self)

    async def start(self, start: Start) -> EngineInfo:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "triton_serve_vllm.engine_process", str(theirs.fileno()),
                pass_fds=(theirs.fileno(),), env={**os.environ, **self.env}, stdin=asyncio.subprocess.DEVNULL,
                # Its own process group (vLLM's processes, which _end_group ends), in the server's session: a
                # session of its own is a scheduling group of its own under Linux's autogroup, which shares the CPUs
                # between the server and the engine as equals and, on 2 cores, held the server's first responses of
                # a burst of requests back for hundreds of ms. (uvloop takes no ``process_group``.)
                preexec_fn=os.setpgrp)
        finally:
            theirs.close()
        self._started = loop.create_future()
        _, self._protocol = await loop.connect_accepted_socket(
            lambda: FrameProtocol(self._on_messages, self._on_closed), sock=ours)
        self._protocol.send([("start", start)])
        try:
            self.info = await asyncio.wait_for(self._started, START_WAIT_S)
        except asyncio.TimeoutError:
            await self.stop()
            raise ServerError(f"{self.label}: the vLLM engine did not get ready within {START_WAIT_S:.0f} s "
                              "(its log above says how far it got)") from None
        except BaseException:
            await self.stop()
            raise
        return self.info

    def submit(self, request: InferenceRequest, message_for: Callable[[InferenceRequest, int], Any]) -> None:
        """Send ``request`` to the engine (``message_for(request, key)`` makes its message); a request cancelled
        later is aborted in vLLM and answered CANCELLED at once."""
        if self.dead is not None:
            raise ServerError(self.dead, Status.UNAVAILABLE)
        key = next(self._keys)
        message = message_for(request, key)
        self._requests[key] = request
        assert self._protocol is not None
        self._protocol.send([message])
        request.when_cancelled(lambda: self._cancel(key))

    def _cancel(self, key: int) -> None:
        request = self._requests.pop(key, None)
        if request is None:
            return
        if self._protocol is not None:
            self._protocol.send([("abort", key)])
        if not request.finished:
            request.send(InferenceResponse.from_error(ServerError("Request was cancelled", Status.CANCELLED)))

    # ---- frames from the engine process -----------------------------------------------------------

    def _on_messages(self, messages: list[Any]) -> None:
        """The engine's messages. Outputs of one request that arrived together make one response: when the server
        falls behind vLLM, its responses catch up (as vLLM's own server merges the deltas its client has not
        taken yet)."""
        requests = self._requests
        waiting: dict[int, tuple[Outputs, bool]] = {}  # outputs not sent yet, by request
        for message in messages:
            kind = message[0]
            if kind == "out":
                _, key, outputs, final = message
                earlier = waiting.pop(key, None)
                waiting[key] = (earlier[0].then(outputs) if earlier is not None else outputs, final)
                continue
            if kind in ("error", "aborted") and message[1] in waiting:  # first what came before it
                self._send_outputs(message[1], *waiting.pop(message[1]))
            if kind == "error":
                _, key, text, status = message
                request = requests.pop(key, None)
                if request is not None and not request.finished:
                    request.send(InferenceResponse.from_error(ServerError(text, Status[status])))
            elif kind == "metrics":
                if self.on_metrics is not None:
                    self.on_metrics(message[1])
            elif kind == "aborted":
                _, key, reason, unfinished = message
                self.aborted += 1
                self.unfinished_after_abort = unfinished
                log.info("vLLM aborted request %s of %s (finish reason %r; %d requests unfinished in the engine)",
                         key, self.label, reason, unfinished)
            elif kind == "ready" and self._started is not None and not self._started.done():
                self._started.set_result(message[1])
            elif kind == "fatal" and self._started is not None and not self._started.done():
                self._started.set_exception(ServerError(f"{self.label}: the vLLM engine did not start: {message[1]}"))
        for key, (outputs, final) in waiting.items():
            self._send_outputs(key, outputs, final)

    def _send_outputs(self, key: int, outputs: Outputs, final: bool) -> None:
        request = self._requests.pop(key, None) if final else self._requests.get(key)
        if request is not None and not request.finished:
            request.send(InferenceResponse(_tensors(outputs)), final=final)

    def _on_closed(self, error: Exception | None) -> None:
        if self._started is not None and not self._started.done():
            self._started.set_exception(ServerError(f"{self.label}: the vLLM engine process exited while starting "
                                                    "(its log above says why)"))
        if self._stopping:
            return
        self.dead = (f"the vLLM engine process of {self.label} exited; the model is not ready until it is loaded "
                     "again")
        log.error("%s", self.dead)
        self._fail_all(self.dead, Status.UNAVAILABLE)
        self._end_group()  # vLLM's engine core and workers outlive their parent: end them too

    def _end_group(self) -> None:
        """Kill what is left of the engine process's group (vLLM's own processes)."""
        if self._process is not None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _fail_all(self, message: str, status: Status) -> None:
        requests, self._requests = self._requests, {}
        for request in requests.values():
            if not request.finished:
                request.send(InferenceResponse.from_error(ServerError(message, status)))

    # ---- the end ----------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Close the socket (the engine process shuts vLLM down and exits) and wait for the process."""
        self._stopping = True
        self._fail_all(f"{self.label} was unloaded while generating", Status.UNAVAILABLE)
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        process = self._process
        if process is None:
            return
        try:
            await asyncio.wait_for(process.wait(), EXIT_WAIT_S)
        except asyncio.TimeoutError:
            log.warning("the vLLM engine process of %s did not exit in %.0f s: killed", self.label, EXIT_WAIT_S)
        self._end_group()
        await process.wait()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None


def _tensors(outputs: Outputs) -> list[Tensor]:
    """The response's output tensors (the ones the request asked for)."""
    count = len(outputs.text)
    tensors = [Tensor("text_output", "BYTES", (count,), np.array([text.encode() for text in outputs.text],
                                                                  dtype=np.object_))]
    if outputs.finish_reason is not None:
        tensors.append(Tensor("finish_reason", "BYTES", (count,),
                              np.array([reason.encode() for reason in outputs.finish_reason], dtype=np.object_)))
    if outputs.cumulative_logprob is not None:
        tensors.append(Tensor("cumulative_logprob", "FP32", (count,),
                              np.array(outputs.cumulative_logprob, dtype=np.float32)))
    if outputs.logprobs is not None:
        tensors.append(Tensor("logprobs", "BYTES", (count,),
                              np.array([item.encode() for item in outputs.logprobs], dtype=np.object_)))
    if outputs.num_input_tokens is not None:
        tensors.append(Tensor("num_input_tokens", "UINT32", (1,), np.array([outputs.num_input_tokens], np.uint32)))
    if outputs.num_output_tokens is not None:
        tensors.append(Tensor("num_output_tokens", "UINT32", (count,),
                              np.array(outputs.num_output_tokens, dtype=np.uint32)))
    return tensors
