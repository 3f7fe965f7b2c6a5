"""Triton's request tracing: which requests are sampled, what their traces record, where the traces go.

The model owner's ``Tracer`` holds the global and per-model trace settings and samples requests in
``DataPlane.submit``. A sampled request carries a ``Trace`` (``request.trace``) that the data plane and
the instance pool stamp with the core's timestamps (REQUEST_START, QUEUE_START, COMPUTE_*,
REQUEST_END, already measured for statistics) and, at the TENSORS level, the tensors. A front-end
notes its own timestamps (HTTP_RECV_*, HTTP_SEND_*, GRPC_*) in a ``FrontendTrace`` while tracing is
armed, and hands them to the trace once its response is sent; a front-end process sends them over its
channel. A request that a scheduler or model sends through ``InferenceClient`` for a traced request (an
ensemble step, a BLS call) gets a child trace (Triton's ``SpawnChildTrace``): its own id, the parent's id
as ``parent_id``, the parent's setting, whatever the rate; such requests are never sampled on their own.
A trace and its children are written or exported together once every one of them is done (the first
trace holds the group). With tracing off, a request costs an attribute check in its front-end and in
``submit`` (one a model or scheduler sends: a call to ``sample``), and an ``is None`` check in the
instance pool and per response; nothing crosses the front-end channel.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from .errors import ServerError
from .frontend.trace import TRACEPARENT, FrontendTrace, Stamps
from .subscribers import Subscribers
from .trace_settings import (OPENTELEMETRY_MODE, TRITON_MODE, SettingUpdate, SettingValues, TraceConfig, TraceLevel,
                             invalid_reason, level_names, merged)

if TYPE_CHECKING:
    from .inference import InferenceRequest, InferenceResponse, Tensor
    from .statistics import ComputeTiming
    from .trace_otel import OpenTelemetryExporter

log = logging.getLogger(__name__)

# ``request.trace`` of a request sent for an untraced request (``inherit``): it is not traced at all.
UNTRACED_CHILD: Final = object()


class TraceFile:
    """The trace file: ``save`` appends traces to the JSON array in ``path`` (which is valid JSON after
    every save), ``save_indexed`` writes them as the array in ``<path>.<n>``, n = 0, 1, ..."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._index = 0
        self._started = False  # the first save truncates the file; later ones (even after close) append
        self._handle: Any = None

    def save(self, traces: str) -> None:
        try:
            if self._handle is None:
                self._handle = open(self.path, "r+b" if self._started else "wb")
            if self._started:
                self._handle.seek(-1, 2)  # over the closing bracket
                self._handle.write(b"," + traces.encode() + b"]")
            else:
                self._handle.write(b"[" + traces.encode() + b"]")
                self._started = True
            self._handle.flush()
        except OSError as error:
            log.error("failed creating trace file: %s", error)

    def save_indexed(self, traces: str) -> None:
        name = f"{self.path}.{self._index}"
        self._index += 1
        try:
            with open(name, "w", encoding="utf-8") as file:
                file.write("[" + traces + "]")
        except OSError as error:
            log.error("failed creating trace file: %s", error)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class TraceSetting:
    """One trace setting in force (the global one or a model's), with its sampling state and the traces
    collected under it that are not written yet. A changed setting is a new object; the old one writes
    its remaining traces once the traces sampled under it are done (``retire``)."""

    def __init__(self, values: SettingValues, specified: frozenset[str], mode: str, file: TraceFile) -> None:
        self.level = values.level
        self.rate = values.rate
        self.count = values.count  # traces left to sample; -1: no limit
        self.log_frequency = values.log_frequency
        self.filename = values.file
        self.specified = specified  # the fields this setting sets itself; the others mirror its fallback
        self.mode = mode
        self.file = file
        self.invalid_reason = invalid_reason(values, mode)
        self._seen = 0  # requests counted for the rate
        self._collected = 0
        self._in_flight = 0
        self._retired = False
        self._pending: list[str] = []  # written traces not yet saved to a file

    @property
    def values(self) -> SettingValues:
        return SettingValues(self.level, self.rate, self.count, self.log_frequency, self.filename)

    @property
    def valid(self) -> bool:
        return not self.invalid_reason and self.count != 0

    def sample(self, forced: bool) -> bool:
        """Whether the next request is traced: every ``rate``-th while ``count`` lasts, or when ``forced``
        (a propagated OpenTelemetry context), as Triton counts them."""
        hit = False
        if self.rate != 0:
            if not self.valid and not forced:
                return False
            self._seen += 1
            hit = self._seen % self.rate == 0
            if hit and self.count > 0:
                self.count -= 1
            elif hit and self.count == 0:
                hit = False
        if hit or forced:
            self._in_flight += 1
            return True
        return False

    def collect(self, trace: str | None) -> None:
        """A trace sampled under this setting is done (``trace``: its JSON records, None when exported
        elsewhere). Saves to ``<file>.<n>`` when ``log_frequency`` traces are pending, or when the count
        has run out and every sampled trace is in."""
        self._in_flight -= 1
        if trace:
            self._pending.append(trace)
            self._collected += 1
            if ((self.count == 0 and self._collected == self._seen)
                    or (self.log_frequency and len(self._pending) >= self.log_frequency)):
                self.file.save_indexed(self._take())
        if self._retired and self._in_flight == 0:
            self._flush()

    def retire(self) -> None:
        """This setting was replaced: save what is pending once its in-flight traces are done."""
        self._retired = True
        if self._in_flight == 0:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            traces = self._take()
            if self.log_frequency:
                self.file.save_indexed(traces)
            else:
                self.file.save(traces)

    def _take(self) -> str:
        traces = ",".join(self._pending)
        self._pending.clear()
        return traces


class Trace:
    """The trace of one sampled request, or of a request sent for one (a child). Holders: the data plane
    until the final response, the instance pool during each execution, the front-end until its response
    is sent (``frontend_done``), and, on the group's first trace (``root``), each unfinished child."""

    __slots__ = ("tracer", "setting", "id", "parent_id", "root", "children", "request", "caller", "stamps",
                 "tensors", "holders", "awaits_frontend", "sampled_ns", "finished_ns", "timestamps", "with_tensors")

    def __init__(self, tracer: Tracer, setting: TraceSetting, trace_id: int, request: InferenceRequest,
                 caller: Any, awaits_frontend: bool, spawned_by: Trace | None = None) -> None:
        self.tracer = tracer
        self.setting = setting
        self.id = trace_id
        self.parent_id = spawned_by.id if spawned_by is not None else 0  # Triton's: 0 for no parent
        self.root: Trace = spawned_by.root if spawned_by is not None else self
        self.children: list[Trace] = []  # on the root: every trace spawned in its group, in order
        self.request = request  # for the model name, version and request id
        self.caller = caller  # the caller's OpenTelemetry context, or None
        self.timestamps = bool(setting.level & TraceLevel.TIMESTAMPS)  # what the level collects
        self.with_tensors = bool(setting.level & TraceLevel.TENSORS) and tracer.exporter is None
        self.stamps: Stamps = []
        self.tensors: list[tuple[int, str]] = []  # (ns, TENSORS record)
        self.holders = 2 if awaits_frontend else 1
        self.awaits_frontend = awaits_frontend
        self.sampled_ns = time.monotonic_ns()
        self.finished_ns = 0
        self.stamp("REQUEST_START", request.arrival_ns)

    def stamp(self, name: str, ns: int) -> None:
        if self.timestamps:
            self.stamps.append((name, ns))

    def queued(self, request: InferenceRequest) -> None:
        """The data plane handed the request to its scheduler."""
        self.stamp("QUEUE_START", request.enqueued_ns)
        if self.with_tensors:
            self._tensors("TENSOR_QUEUE_INPUT", request.inputs.values())

    def hold(self) -> None:
        self.holders += 1

    def computed(self, timing: ComputeTiming, end_ns: int) -> None:
        """An execution of the request ended (the pool took a hold before it began)."""
        input_end = timing.inputs_ready_ns if timing.inputs_ready_ns is not None else timing.start_ns
        output_start = timing.outputs_ready_ns if timing.outputs_ready_ns is not None else end_ns
        for name, ns in (("COMPUTE_START", timing.start_ns), ("COMPUTE_INPUT_END", input_end),
                         ("COMPUTE_OUTPUT_START", output_start), ("COMPUTE_END", end_ns)):
            self.stamp(name, ns)
        self.release()

    def responded(self, response: InferenceResponse | None, final: bool) -> None:
        """A response left the backend; the final one ends the request."""
        if response is not None and response.error is None and self.with_tensors:
            self._tensors("TENSOR_BACKEND_OUTPUT", response.outputs)
        if final:
            self.stamp("REQUEST_END", time.monotonic_ns())
            self.release()

    def frontend_done(self, stamps: Stamps) -> None:
        """The front-end sent the response: its timestamps join the trace."""
        if self.timestamps:
            self.stamps.extend(stamps)
        self.release()

    def release(self) -> None:
        self.holders -= 1
        if self.holders == 0:
            self.finished_ns = time.monotonic_ns()
            if self.root is self:
                self.tracer.finish(self)
            else:
                self.root.release()

    def spawn_child(self, request: InferenceRequest) -> Trace | None:
        """The child trace of ``request``, sent for this trace's request; None once this trace's group is
        written (a request sent after its parent ended: a decoupled model's late BLS call)."""
        root = self.root
        if root.holders == 0:
            return None
        root.hold()
        child = Trace(self.tracer, self.setting, self.tracer.next_id(), request, None, False, self)
        root.children.append(child)
        return child

    def _tensors(self, activity: str, tensors: Any) -> None:
        now = time.monotonic_ns()
        self.tensors.extend((now, tensor_record(self.id, activity, tensor)) for tensor in tensors)

    def ordered_stamps(self) -> Stamps:
        """The timestamps in time order (the front-end's come in last); ties keep the order stamped."""
        return sorted(self.stamps, key=lambda stamp: stamp[1])

    def to_json(self) -> str:
        """Triton's records for this trace, comma-separated, in time order: one per timestamp (the model
        record just before REQUEST_START) and one per tensor."""
        records = [(ns, index, f'{{"id":{self.id},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}')
                   for index, (name, ns) in enumerate(self.stamps)]
        records += [(ns, len(self.stamps) + index, text) for index, (ns, text) in enumerate(self.tensors)]
        if self.stamps:  # the first stamp is REQUEST_START
            records.append((self.stamps[0][1], -1, self._model_record()))
        return ",".join(text for _, _, text in sorted(records))

    def _model_record(self) -> str:
        request = self.request
        version = request.model_version if request.model_version is not None else -1
        text = f'{{"id":{self.id},"model_name":{json.dumps(request.model_name)},"model_version":{version}'
        if request.id:
            text += f',"request_id":{json.dumps(request.id)}'
        if self.parent_id:
            text += f',"parent_id":{self.parent_id}'
        return text + "}"


def inherit(request: InferenceRequest, parent: InferenceRequest | None) -> None:
    """Before ``request``, which a scheduler or model sends for ``parent``, is submitted: trace it as a
    child of ``parent`` if that is traced, else not at all (Triton samples only what front-ends receive)."""
    trace = parent.trace if parent is not None else None
    request.trace = trace if isinstance(trace, Trace) else UNTRACED_CHILD


def tensor_record(trace_id: int, activity: str, tensor: Tensor) -> str:
    """Triton's TENSORS record: the elements, comma-separated (strings quoted; none for FP16/BF16)."""
    flat = tensor.data.ravel()
    datatype = tensor.datatype
    if datatype in ("FP16", "BF16"):
        data = ""
    elif datatype == "BYTES":
        data = ",".join('"' + (x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)) + '"' for x in flat)
    elif datatype in ("FP32", "FP64"):
        data = ",".join(format(x, "g") for x in flat.tolist())
    elif datatype == "BOOL":
        data = ",".join("1" if x else "0" for x in flat.tolist())
    else:
        data = ",".join(str(x) for x in flat.tolist())
    shape = ",".join(str(dim) for dim in tensor.shape)
    return (f'{{"id":{trace_id},"activity":"{activity}","tensor":{{"name":{json.dumps(tensor.name)},'
            f'"data":{json.dumps(data)},"shape":"{shape}","dtype":"{datatype}"}}}}')


class Tracer:
    """The model owner's trace settings and sampler (Triton's TraceManager).

    ``settings(model)`` and ``update(model, changes)`` serve the trace extension; ``sample(request)``
    runs in ``DataPlane.submit``; ``armed`` says whether any setting traces at all (front-ends note
    their timestamps only then); ``subscribe`` learns when it changes.
    """

    def __init__(self, config: TraceConfig | None = None) -> None:
        self.config = config or TraceConfig()
        self.mode = self.config.mode
        self.file = TraceFile(self.config.file)
        self.exporter: OpenTelemetryExporter | None = None
        if self.mode == OPENTELEMETRY_MODE:  # imported only here: it needs the optional packages
            from . import trace_otel
            self.exporter = trace_otel.OpenTelemetryExporter(self.config)
        start = self.config.values()
        self._default = TraceSetting(start, frozenset(), self.mode, self.file)  # what a cleared global field takes
        self._global = TraceSetting(start, frozenset(), self.mode, self.file)
        self._models: dict[str, TraceSetting] = {}
        self._ids = itertools.count(1)
        self._subscribers = Subscribers[bool]()
        self.armed = bool(start.level)

    # ---- the trace extension ----------------------------------------------------------------

    def settings(self, model: str = "") -> dict[str, list[str]]:
        """The settings in force for ``model`` (the global ones when it has none, or no model is named),
        each as a list of strings, in Triton's order."""
        setting = self._models.get(model, self._global)
        found = {"trace_level": level_names(setting.level), "trace_rate": [str(setting.rate)],
                 "trace_count": [str(setting.count)]}
        if self.mode == TRITON_MODE:
            found["log_frequency"] = [str(setting.log_frequency)]
            found["trace_file"] = [setting.filename]
        found["trace_mode"] = [self.mode]
        for key, value in self.config.options:
            if key not in ("file", "log-frequency"):
                found.setdefault(key, []).append(value)
        return found

    async def update(self, model: str, update: SettingUpdate) -> None:
        """Apply a client's change to ``model``'s setting, or to the global one (and to every model
        setting that mirrors some global field); return once every subscriber says it knows whether tracing
        is armed. Raises ServerError for a setting that cannot trace."""
        self._update_one(model, update)
        if not model:  # a model setting mirrors at least the global file, so each is made anew
            for name in list(self._models):
                self._update_one(name, {})
        armed = any(setting.level for setting in (self._global, *self._models.values()))
        if armed != self.armed:
            self.armed = armed
            await self._subscribers.notify(armed)

    def _update_one(self, model: str, update: SettingUpdate) -> None:
        current = self._models.get(model) if model else self._global
        fallback = self._global if model else self._default
        values, specified = merged(fallback.values, current.values if current else None,
                                   current.specified if current else frozenset(), update)
        if model and not specified:  # nothing of its own: the model follows the global setting
            if current is not None:
                del self._models[model]
                current.retire()
            return
        setting = TraceSetting(values, specified, self.mode, self.file)
        if not setting.valid and setting.level:
            raise ServerError(f"Attempting to set invalid trace setting :{setting.invalid_reason}")
        if model:
            self._models[model] = setting
        else:
            self._global = setting
        if current is not None:
            current.retire()

    def subscribe(self, subscriber: Callable[[bool], Awaitable[None] | None]) -> None:
        """Call ``subscriber(armed)`` whenever ``armed`` changes; what it returns, if anything, is awaited."""
        self._subscribers.add(subscriber)

    # ---- requests ---------------------------------------------------------------------------

    def next_id(self) -> int:
        """A new trace id (1, 2, ...: 0 means no parent)."""
        return next(self._ids)

    def sample(self, request: InferenceRequest) -> None:
        """Decide whether ``request`` is traced: afterwards ``request.trace`` is its Trace, or None.
        Before, it may hold the front-end's FrontendTrace, or what ``inherit`` gave it."""
        frontend = request.trace
        request.trace = None
        if isinstance(frontend, Trace):  # sent for a traced request: its child, whatever the setting says now
            request.trace = frontend.spawn_child(request)
            return
        if frontend is UNTRACED_CHILD or not self.armed:
            return
        setting = self._models.get(request.model_name, self._global) if self._models else self._global
        caller = None
        if self.exporter is not None and frontend is not None and frontend.parent and setting.level:
            caller = self.exporter.parent_context(frontend.parent)
        if not setting.sample(caller is not None):
            return
        if self.exporter is not None and setting.level & TraceLevel.TENSORS:
            log.error("Tensor level tracing is not supported by the mode: opentelemetry")
        trace = Trace(self, setting, self.next_id(), request, caller, frontend is not None)
        if frontend is not None:
            frontend.report_to(trace.frontend_done)
        request.trace = trace

    def finish(self, trace: Trace) -> None:
        """Every holder let go of ``trace`` and of its children: write them, or export them."""
        if self.exporter is not None:
            self.exporter.export(trace)
            trace.setting.collect(None)
        else:
            group = (each.to_json() for each in (trace, *trace.children))
            trace.setting.collect(",".join(records for records in group if records))

    async def close(self) -> None:
        """At shutdown: save every pending trace and flush the exporter."""
        for setting in (self._global, *self._models.values()):
            setting.retire()
        self.file.close()
        if self.exporter is not None:
            await asyncio.to_thread(self.exporter.close)
