"""OpenTelemetry traces (the `otel` extra, OTEL_EXPORTER_OTLP_ENDPOINT set): the API's
requests, the database's statements, the broker's sends and the worker's jobs, sent to the
OTLP endpoint. A job's span continues the trace of the request that queued it (its
`traceparent` is stored on the job row, so a job sent again by the sweeper or released after
the jobs it waited for still joins it), and a request that reuses an open job links to that
job's span. Only `startup.start_process` imports this module."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from service.observability import origin

UNTRACED_ROUTES = "healthz,readyz,metrics"  # probes and scrapes: no span
PROPAGATOR = TraceContextTextMapPropagator()
tracer = trace.get_tracer("flipgate")


def start(process_name: str, exporter: SpanExporter | None = None) -> None:
    """Trace this process (once): spans batched to `exporter` (default: OTLP over HTTP to
    OTEL_EXPORTER_OTLP_ENDPOINT), database engines created from now on and Celery's sends
    and tasks instrumented, and job rows stamped with the trace context."""
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: f"flipgate-{process_name}"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    # release 0.66b2 declares SQLAlchemy < 2.1; it works with 2.1 (tests/service/test_tracing.py)
    SQLAlchemyInstrumentor().instrument(skip_dep_check=True)
    CeleryInstrumentor().instrument()
    origin.use_tracing(traceparent=current_traceparent, job_span=job_span,
                       job_reused=link_to_job)


def trace_app(app: FastAPI) -> None:
    """Give each request of `app` a server span (named by its route template)."""
    FastAPIInstrumentor.instrument_app(app, excluded_urls=UNTRACED_ROUTES)


def current_traceparent() -> str | None:
    """The W3C traceparent of the span under way, if one is."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def job_span(*, traceparent: str | None, kind: str, job_id: int) -> Iterator[None]:
    """A span for a job's run, a child of the span that queued it (in that request's trace),
    linked to the span under way (Celery's task span) when there is one."""
    under_way = trace.get_current_span().get_span_context()
    parent = PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
    with tracer.start_as_current_span(
            f"job {kind}", context=parent, kind=SpanKind.CONSUMER,
            links=[Link(under_way)] if under_way.is_valid else None,
            attributes={"flipgate.job.id": job_id, "flipgate.job.kind": kind}):
        yield


def link_to_job(job: Any) -> None:
    """The span under way reuses `job`, queued by an earlier request: link to its trace."""
    if job.traceparent is None:
        return
    linked = trace.get_current_span(PROPAGATOR.extract({"traceparent": job.traceparent}))
    trace.get_current_span().add_link(linked.get_span_context(), {"flipgate.job.id": job.id})
