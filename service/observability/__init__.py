"""Operations: Prometheus metrics, structured logs with a request id, optional traces.

All instrumentation lives here (DESIGN.md): `context` (the request id of the work under way),
`logs` (text or JSON lines), `http` (the middleware that times requests and counts refusals,
per host), `collector` (work and outcomes read from the database at scrape time), `router`
(`GET /metrics`), `origin` (the request id and trace context stamped on the rows a request
creates and restored in the worker that runs them), `startup` (what each entry point turns
on) and, with the `otel` extra and OTEL_EXPORTER_OTLP_ENDPOINT only, `tracing`. The domains
name no metric and log no request id.
"""
