"""The flipgate server: SQL store, artifact store and (later) the HTTP API."""
