"""`GET /metrics`: the Prometheus text format, for a token with the `metrics` scope."""

import os
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as TEXT_FORMAT
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from service.deps import CommittingRoute, require_server
from service.metrics.collector import DatabaseFigures
from service.observability.http import METRICS

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # set by `flipgate serve` (service.cli)
# the classic text format (every Prometheus release reads it; all names are plain ASCII)
router = APIRouter(tags=["health"], route_class=CommittingRoute)


@router.get("/metrics", dependencies=[require_server("metrics")], response_class=Response,
            responses={200: {"content": {TEXT_FORMAT: {}},
                             "description": "the Prometheus text format"}})
def metrics(request: Request) -> Response:
    """Every figure, in the Prometheus text format (docs/operations.md lists them): the
    requests of this host's API processes and the whole server's work and outcomes."""
    registry: CollectorRegistry = request.app.state.metrics
    return Response(generate_latest(registry), media_type=TEXT_FORMAT)


class ThisProcess(Collector):
    """The request figures of this process alone (an app outside `flipgate serve`)."""

    def collect(self) -> Iterator[Metric]:
        for metric in METRICS:
            yield from metric.collect()


def metrics_registry(state: Any) -> CollectorRegistry:
    """What /metrics answers: the request figures summed over the host's API processes
    (prometheus-client's multiprocess mode, when `serve` set it up), else this process's, and
    the database's figures."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(MULTIPROCESS_DIR):
        MultiProcessCollector(registry)
    else:
        registry.register(ThisProcess())
    registry.register(DatabaseFigures(state))
    return registry
