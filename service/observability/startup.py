"""What each entry point turns on: its log lines, the origin stamps on the rows it inserts,
and traces when OTEL_EXPORTER_OTLP_ENDPOINT is set and the `otel` extra is installed
(OpenTelemetry is imported here only then)."""

import logging
from typing import Any

from service.config import Settings
from service.observability.logs import configure_logging

__all__ = ["configure_logging", "start_process", "trace_app"]
from service.observability.origin import install_origin_stamps

OTEL_MISSING = ("OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed: "
                "install flipgate[otel]; no traces are sent")
logger = logging.getLogger(__name__)


def start_process(settings: Settings, process_name: str, *, logs: bool = True) -> bool:
    """Observe this process (the API's, a worker's or the sweeper's): its logs in
    FLIPGATE_LOG_FORMAT (unless `logs` is False: an app in a test keeps the test's), the
    origin stamps, and traces when asked for; whether traces are on."""
    if logs:
        configure_logging(settings.log_format, process_name)
    install_origin_stamps()
    if not settings.otel_endpoint:
        return False
    try:
        from service.observability import tracing
    except ImportError:
        logger.warning(OTEL_MISSING)
        return False
    tracing.start(process_name)
    return True


def trace_app(app: Any) -> None:
    """Spans for the app's requests (only called once traces are on)."""
    from service.observability import tracing

    tracing.trace_app(app)
