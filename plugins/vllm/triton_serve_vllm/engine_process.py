"""The vLLM engine process of one model instance: vLLM's AsyncLLM, driven by frames from the server.

    python -m triton_serve_vllm.engine_process <socket fd>

The server starts it at load with one end of a socket pair and sends ``("start", Start)`` first; it answers
``("ready", EngineInfo)`` once the engine runs (or ``("fatal", message)`` and exits). It then generates each
request in a task of its own and sends the outputs ready at one moment in one frame. It exits when the server
closes the socket (an unload, or the server went away) or when the engine dies.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any

import uvloop

from .protocol import Embed, EngineInfo, FrameProtocol, Generate, Start

log = logging.getLogger("triton_serve_vllm.engine")
CPU_LORA_WORKER = "triton_serve_vllm.cpu_lora_worker.FixedCPUWorker"


class EngineProcess:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.engine: Any = None
        self.loras: dict[str, str] = {}
        self.model_name = ""
        self.supported_tasks: tuple[str, ...] = ()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.aborting: set[int] = set()
        self.gatherer: Any = None
        self._pending: list[Any] = []
        self._flush_scheduled = False
        self._started: asyncio.Future[Start] | None = None
        self._closed = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        _, self.protocol = await loop.connect_accepted_socket(
            lambda: FrameProtocol(self.on_messages, self.on_closed), sock=self.sock)
        start = await self._started
        try:
            info = await self.start(start)
        except Exception as error:  # the engine could not start: say why, then exit
            log.exception("the vLLM engine did not start")
            self.protocol.send([("fatal", f"{type(error).__name__}: {error}")])
            self._close_socket()
            return
        self.protocol.send([("ready", info)])
        try:
            await self._closed.wait()
        finally:
            self.engine.shutdown()

    async def start(self, start: Start) -> EngineInfo:
        from vllm import __version__
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.buckets import build_1_2_5_buckets

        from .stats import MetricGatherer

        self.loras = start.loras
        self.model_name = start.model_name
        args = AsyncEngineArgs(**start.engine_args)
        if args.enable_lora and current_platform.is_cpu() and args.worker_cls == "auto":
            args.worker_cls = CPU_LORA_WORKER  # fixes vLLM's CPU LoRA ops in its worker processes (cpu_lora.py)
        loggers = None
        if start.metrics:
            self.gatherer = MetricGatherer(self._schedule_flush)
            loggers = [self.gatherer.factory]
        self.engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER,
                                                stat_loggers=loggers)
        self.supported_tasks = tuple(await self.engine.get_supported_tasks())
        max_model_len = self.engine.model_config.max_model_len
        return EngineInfo(__version__, current_platform.device_type, max_model_len, self.supported_tasks,
                          tuple(build_1_2_5_buckets(max_model_len)))

    # ---- frames from the server ------------------------------------------------------------------

    def on_messages(self, messages: list[Any]) -> None:
        for message in messages:
            if isinstance(message, Generate):
                self._spawn(message.key, self.generate(message))
            elif isinstance(message, Embed):
                self._spawn(message.key, self.embed(message))
            elif message[0] == "abort":
                if message[1] in self.tasks:
                    self.aborting.add(message[1])
                    asyncio.ensure_future(self.engine.abort(str(message[1])))
            elif message[0] == "start" and self._started is not None and not self._started.done():
                self._started.set_result(message[1])

    def on_closed(self, error: Exception | None) -> None:
        self._closed.set()
        if self._started is not None and not self._started.done():
            self._started.cancel()

    def _spawn(self, key: int, work: Any) -> None:
        self.tasks[key] = asyncio.ensure_future(work)

    # ---- requests ---------------------------------------------------------------------------------

    async def generate(self, message: Generate) -> None:
        from .sampling import lora_request, prompt, request_parameters, sampling_params
        from .shaping import ResponseShaper

        key = message.key
        try:
            # Triton's order: the LoRA name is checked first, then the model's task, then the sampling parameters
            parameters = request_parameters(message)
            lora = lora_request(parameters.pop("lora_name", None), self.loras)
            self._check_task("generate")
            params = sampling_params(parameters, message.flags.stream)
            shaper = ResponseShaper(message.flags, params.n, params.logprobs is not None)
            async for output in self.engine.generate(prompt(message), params, str(key), lora_request=lora):
                if key in self.aborting:
                    if output.finished:
                        reason = output.outputs[0].finish_reason if output.outputs else None
                        self.emit(("aborted", key, reason, self.engine.get_num_unfinished_requests()))
                    continue
                self.emit(("out", key, shaper.outputs(output), output.finished))
        except Exception as error:
            self._fail(key, error)
        finally:
            self.tasks.pop(key, None)
            self.aborting.discard(key)

    async def embed(self, message: Embed) -> None:
        from .embedding import embedding_outputs, pooling_request

        key = message.key
        try:
            self._check_task("embed")
            prompt, params = pooling_request(message.request)
            async for output in self.engine.encode(prompt, params, str(key)):
                if output.finished:
                    self.emit(("out", key, embedding_outputs(output, message.flags), True))
        except Exception as error:
            self._fail(key, error)
        finally:
            self.tasks.pop(key, None)
            self.aborting.discard(key)

    def _check_task(self, task: str) -> None:
        """Triton's refusal of a request the model's task does not serve."""
        if task not in self.supported_tasks:
            raise ValueError(f"Model {self.model_name} does not support '{task}' request")

    def _fail(self, key: int, error: Exception) -> None:
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(error, EngineDeadError):
            self.emit(("error", key, f"the vLLM engine died: {error}", "UNAVAILABLE"))
            self._close_socket()  # the server sees the process end and makes the model unready
        elif isinstance(error, (VLLMClientError, ValueError, TypeError)):  # a bad request: vLLM's message
            self.emit(("error", key, str(error), "INVALID_ARG"))
        else:
            log.error("request %s failed", key, exc_info=error)
            self.emit(("error", key, f"Error generating stream: {error}", "INTERNAL"))

    # ---- frames to the server ---------------------------------------------------------------------

    def emit(self, message: Any) -> None:
        self._pending.append(message)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send what became ready in this turn of the loop (the outputs of one engine step, its metrics) as one
        frame."""
        self._flush_scheduled = False
        messages, self._pending = self._pending, []
        if self.gatherer is not None:
            update = self.gatherer.take()
            if update is not None:
                messages.append(("metrics", update))
        if messages:
            self.protocol.send(messages)

    def _close_socket(self) -> None:
        self._flush()
        if self.protocol.transport is not None:
            self.protocol.transport.close()  # written frames are flushed first
        self._closed.set()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sock = socket.socket(fileno=int(sys.argv[1]))
    uvloop.run(EngineProcess(sock).run())  # the loop vLLM's own server runs on


if __name__ == "__main__":
    main()
