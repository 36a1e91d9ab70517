"""`GET /metrics`: the figures Prometheus scrapes (docs/operations.md lists them). `router` answers
them: the request figures of service.observability.http, summed over the host's API processes,
with `collector`'s whole-server figures of work and outcomes, read from the jobs', decisions'
and callbacks' rows at scrape time. It reads the domains, so it sits above them, beside the
other routes; service.observability, which every layer may use, imports no domain."""
