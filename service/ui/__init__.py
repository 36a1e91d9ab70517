"""The dashboard under /ui: server-rendered pages (`router`), their queries, the sign-in and
its session, templates and vendored static assets. Part of the HTTP layer: it may import any
domain, and no domain imports it."""
