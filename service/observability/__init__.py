"""Operations: structured logs with a request id, the request figures, optional traces.

What every layer may use (DESIGN.md): `context` (the request id of the work under way),
`logs` (text or JSON lines), `http` (the middleware that times requests and counts refusals,
per host), `origin` (the request id and trace context stamped on the rows a request creates
and restored in the worker that runs them), `startup` (what each entry point turns on) and,
with the `otel` extra and OTEL_EXPORTER_OTLP_ENDPOINT only, `tracing`. It imports no domain:
the figures read from the domains' rows and `GET /metrics` are service.metrics'. The domains
name no metric and log no request id: the entry points (the app's middleware, the worker's
tasks) bind it.
"""
