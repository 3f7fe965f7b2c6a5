"""OpenTelemetry trace mode: each finished trace becomes Triton's spans, sent by OTLP/HTTP.

Needs the ``trace`` extra (``pip install 'triton-serve[trace]'``: opentelemetry-sdk and
opentelemetry-exporter-otlp-proto-http). Spans, as Triton's tracer.cc makes them: "InferRequest" (a
child of the caller's span when the request carried a W3C ``traceparent``) with the front-end's
timestamps as events; under it a span named after the model, with attributes ``triton.model_name``,
``triton.model_version``, ``triton.trace_id``, ``triton.trace_parent_id`` and ``triton.request_id``
and the events REQUEST_START, QUEUE_START, REQUEST_END; under that a "compute" span with the
COMPUTE_* events. Each child trace (an ensemble step, a BLS call) adds its own model and compute spans,
the model span a child of its parent's model span. All are SERVER spans.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .errors import ServerError
from .trace_settings import BSP_SETTINGS, TraceConfig

if TYPE_CHECKING:
    from .tracing import Trace

DEFAULT_URL = "http://localhost:4318/v1/traces"
SERVICE_NAME = "triton-inference-server"
TRACER_NAME = "triton-server"
MODEL_STAMPS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
COMPUTE_STAMPS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def _batch_setting(config: TraceConfig, name: str) -> int:
    """A Batch Span Processor setting: the last one given, else Triton's default."""
    given = config.option(name)
    return int(given[-1] if given else BSP_SETTINGS[name][1])


class OpenTelemetryExporter:
    """Turns finished traces into spans and exports them in batches (a BatchSpanProcessor thread)."""

    def __init__(self, config: TraceConfig) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, get_current_span, set_span_in_context
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as error:
            raise ServerError(f"--trace-config mode=opentelemetry needs the OpenTelemetry SDK and OTLP/HTTP "
                              f"exporter, which are not installed ({error}): "
                              f"pip install 'triton-serve[trace]'") from None
        urls = config.option("url")
        url = urls[-1] if urls else DEFAULT_URL
        if "://" not in url:  # Triton takes host:port/path
            url = "http://" + url
        attributes = {"service.name": SERVICE_NAME}
        for entry in config.option("resource"):
            key, _, value = entry.partition("=")
            attributes[key] = value
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=url),
            max_queue_size=_batch_setting(config, "bsp_max_queue_size"),
            schedule_delay_millis=_batch_setting(config, "bsp_schedule_delay"),
            max_export_batch_size=_batch_setting(config, "bsp_max_export_batch_size")))
        self._tracer = self._provider.get_tracer(TRACER_NAME)
        self._server_kind = SpanKind.SERVER
        self._propagator = TraceContextTextMapPropagator()
        self._current_span = get_current_span
        self._inside = set_span_in_context  # the context whose current span is the given one

    def parent_context(self, traceparent: str) -> Any:
        """The caller's context from a W3C ``traceparent`` value, or None when it is not a valid one."""
        context = self._propagator.extract({"traceparent": traceparent})
        return context if self._current_span(context).get_span_context().is_valid else None

    def export(self, trace: Trace) -> None:
        """Build the spans of ``trace`` and of its children, timestamps moved from the steady clock to the
        wall clock. A child's model span is a child of its parent's model span."""
        offset = time.time_ns() - time.monotonic_ns()
        root = self._span("InferRequest", trace.sampled_ns + offset, trace.caller)
        for name, ns in trace.ordered_stamps():
            if name not in MODEL_STAMPS and name not in COMPUTE_STAMPS:
                root.add_event(name, timestamp=ns + offset)
        under = {0: self._inside(root)}  # trace id -> the context its children's spans start in
        for each in (trace, *trace.children):
            context = under[each.parent_id]
            inside = self._model_spans(each, context, offset)
            under[each.id] = context if inside is None else inside
        root.end(end_time=trace.finished_ns + offset)

    def _model_spans(self, trace: Trace, context: Any, offset: int) -> Any:
        """The model span of ``trace`` (and its compute span) under ``context``; the context inside the
        model span, or None when the trace has no REQUEST_START."""
        stamps = trace.ordered_stamps()
        found = dict(stamps)
        if "REQUEST_START" not in found:
            return None
        request = trace.request
        model = self._span(request.model_name, found["REQUEST_START"] + offset, context)
        model.set_attribute("triton.model_name", request.model_name)
        version = request.model_version
        model.set_attribute("triton.model_version", version if version is not None else -1)
        model.set_attribute("triton.trace_id", trace.id)
        model.set_attribute("triton.trace_parent_id", trace.parent_id)
        if request.id:
            model.set_attribute("triton.request_id", request.id)
        self._events(model, stamps, ("REQUEST_START", "QUEUE_START"), offset)
        if "COMPUTE_START" in found:
            compute = self._span("compute", found["COMPUTE_START"] + offset, self._inside(model))
            self._events(compute, stamps, COMPUTE_STAMPS, offset)
            compute.end(end_time=found.get("COMPUTE_END", found["COMPUTE_START"]) + offset)
        self._events(model, stamps, ("REQUEST_END",), offset)
        model.end(end_time=found.get("REQUEST_END", trace.finished_ns) + offset)
        return self._inside(model)

    def _span(self, name: str, start_ns: int, context: Any) -> Any:
        """A SERVER span whose parent is ``context``'s current span (none: a new trace)."""
        return self._tracer.start_span(name, context=context, kind=self._server_kind, start_time=start_ns)

    @staticmethod
    def _events(span: Any, stamps: list[tuple[str, int]], names: tuple[str, ...], offset: int) -> None:
        for name, ns in stamps:
            if name in names:
                span.add_event(name, timestamp=ns + offset)

    def close(self) -> None:
        """Export what is queued and stop (blocks: run it in a thread)."""
        self._provider.shutdown()
